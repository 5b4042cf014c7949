// dex dashboard: confirmation of actions and live refresh of the runs table. Our own few
// lines, served with the app: nothing is loaded from the network.
"use strict";
document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
document.addEventListener("DOMContentLoaded", function () {
  var box = document.querySelector("[data-refresh]");
  if (!box) { return; }
  var live = document.getElementById("live");
  var every = parseInt(box.getAttribute("data-interval"), 10) || 5000;
  setInterval(function () {
    if (live && !live.checked) { return; }
    fetch(box.getAttribute("data-refresh"), {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) { if (html !== null) { box.innerHTML = html; } })
      .catch(function () { /* the next refresh tries again */ });
  }, every);
});
