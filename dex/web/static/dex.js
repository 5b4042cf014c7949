// dex dashboard: confirmation of actions, live refresh of the runs table, and a run's published
// values and streams followed live (server-sent events of /v1). Our own few lines, served with
// the app: nothing is loaded from the network.
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
document.addEventListener("DOMContentLoaded", function () {
  // textContent, never HTML: a value is the user's data
  function shown(data) {
    try { return JSON.stringify(JSON.parse(data), null, 2); } catch (e) { return data; }
  }
  function follow(url, kind, onEvent) {
    var source = new EventSource(url);
    source.addEventListener(kind, onEvent);
    source.addEventListener("end", function () { source.close(); });  // else it would reconnect
  }
  document.querySelectorAll("[data-published]").forEach(function (box) {
    follow(box.getAttribute("data-published"), "value", function (event) {
      box.textContent = shown(event.data);
    });
  });
  document.querySelectorAll("[data-stream]").forEach(function (list) {
    var details = list.closest("details");
    var length = details ? details.querySelector(".stream-length") : null;
    var state = details ? details.querySelector(".stream-state") : null;
    var source = new EventSource(list.getAttribute("data-stream"));
    source.addEventListener("item", function (event) {
      var item = document.createElement("li");
      item.value = parseInt(event.lastEventId, 10) || 0;
      var text = document.createElement("pre");
      text.className = "payload";
      text.textContent = shown(event.data);
      item.appendChild(text);
      list.appendChild(item);
      if (length) { length.textContent = String(item.value); }
    });
    source.addEventListener("end", function (event) {
      source.close();
      if (state && JSON.parse(event.data).reason === "closed") { state.textContent = "closed"; }
    });
  });
});
