"""What the app hands out comes back only as it was given: paging cursors (a forged one cannot
make a page read the whole runs table, nor overflow), the note an action leaves on a page (a
link cannot make a page say anything), and the sign-in cookie (issued, expiring, signed); and
wrong tokens at the sign-in form are limited per client."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import dex
from dex.web import create_app
from dex.web.inputs import MAX_CURSOR_OFFSET, Cursor
from dex.web.security import COOKIE, session_value
from dex.web.signin_limit import SignInLimiter
from dex.web.signing import Signer
from tests.web.conftest import BASE, client, waiting
from tests.web.test_poison import healthy_run_completes

TOKEN = "s3cret-Token-value"
SAME_ORIGIN = {"origin": BASE}


def unsigned(data: dict[str, Any]) -> str:
    """A cursor as the API gave them out before they were signed (and as a forger writes one)."""
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


class CountingStore:
    """The engine's store, recording the ``limit`` of every ``list_runs`` it is asked."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.limits = inner, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def list_runs(self, run_filter: Any) -> Any:
        self.limits.append(run_filter.limit)
        return self.inner.list_runs(run_filter)


FORGED = (
    {"t": "2026-01-05T02:00:00+00:00", "o": 10**18},  # read the whole table
    {"t": "2026-01-05T02:00:00+00:00", "o": 10**30},  # a bigint overflow (was a 500)
    {"t": "2026-01-05T02:00:00+00:00", "o": 1e400},  # infinity (was a 422 OverflowError)
    {"t": "9999-12-31T23:59:59.999999+00:00", "o": 0},  # the last instant (was a 422 OverflowError)
    {"t": "2026-01-05T02:00:00+00:00", "o": 3},  # even a harmless one: not this app's
)


@pytest.mark.parametrize("data", FORGED, ids=["1e18", "1e30", "1e400", "year-9999", "small"])
def test_a_forged_cursor_is_a_400_before_the_store_is_asked(engine: dex.Engine, data: dict[str, Any]) -> None:
    store = CountingStore(engine.store)
    app = create_app(dex.Engine(store))
    with client(app) as http:
        for forged in (unsigned(data), unsigned(data) + ".AAAA", unsigned(data) + "." + "A" * 43):
            for url in (f"/v1/runs?cursor={forged}", f"/runs?cursor={forged}", f"/runs/table?cursor={forged}"):
                response = http.get(url)
                assert response.status_code == 400, (url, response.text)
                assert "cursor" in response.text
        assert store.limits == []  # no list_runs was asked for any of them
        healthy_run_completes(engine, http)


def test_the_cursors_of_one_app_are_refused_by_another_and_a_changed_one_by_both(make_engine: Any) -> None:
    engine = make_engine([waiting])
    for _ in range(5):
        engine.start_workflow(waiting)
    with client(create_app(engine, token=TOKEN)) as mine, client(create_app(engine, token="other-token")) as theirs:
        auth = {"authorization": f"Bearer {TOKEN}"}
        cursor = mine.get("/v1/runs?limit=2", headers=auth).json()["next_cursor"]
        assert mine.get(f"/v1/runs?limit=2&cursor={cursor}", headers=auth).status_code == 200
        # an app with the same token (a restart, a replica) takes it: the key comes from the token
        with client(create_app(engine, token=TOKEN)) as again:
            assert again.get(f"/v1/runs?limit=2&cursor={cursor}", headers=auth).status_code == 200
        other = {"authorization": "Bearer other-token"}
        assert theirs.get(f"/v1/runs?limit=2&cursor={cursor}", headers=other).status_code == 400
        payload, _, signature = cursor.partition(".")
        data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        changed = unsigned({**data, "o": 10**18}) + "." + signature  # the signature of another payload
        assert mine.get(f"/v1/runs?limit=2&cursor={changed}", headers=auth).status_code == 400


def test_paging_with_signed_cursors_reads_a_bounded_page_each_time(make_engine: Any) -> None:
    engine = make_engine([waiting])
    started = {engine.start_workflow(waiting) for _ in range(7)}
    store = CountingStore(engine.store)
    with client(create_app(dex.Engine(store))) as http:
        seen: list[str] = []
        cursor = None
        while True:
            body = http.get("/v1/runs", params={"limit": 3, **({"cursor": cursor} if cursor else {})}).json()
            seen += [run["run_id"] for run in body["runs"]]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert sorted(seen) == sorted(started) and len(seen) == 7
        assert max(store.limits) <= 3 + 7 + 1  # the page, the runs shown at one instant, one more


@pytest.mark.parametrize(
    "cursor",
    [
        Cursor(created_at=datetime(2026, 1, 5, tzinfo=UTC), shown_at_instant=MAX_CURSOR_OFFSET + 1),
        Cursor(created_at=datetime(2026, 1, 5, tzinfo=UTC), shown_at_instant=-1),
        Cursor(created_at=datetime.max.replace(tzinfo=UTC), shown_at_instant=0),
    ],
    ids=["offset-too-large", "negative", "last-instant"],
)
def test_even_a_signed_cursor_is_read_strictly(cursor: Cursor) -> None:
    """Were the key ever known, a cursor could still not ask for more than the bound."""
    signer = Signer.for_app(TOKEN)
    with pytest.raises(Exception, match="cursor is not one this API gave out") as refused:
        Cursor.decode(cursor.encode(signer), signer)
    assert getattr(refused.value, "status", None) == 400
    fine = Cursor(created_at=datetime(2026, 1, 5, tzinfo=UTC), shown_at_instant=MAX_CURSOR_OFFSET)
    assert Cursor.decode(fine.encode(signer), signer) == fine


def test_a_page_shows_only_the_notes_this_app_wrote(engine: dex.Engine, http: Any) -> None:
    spoof = "Your session expired: sign in again at evil.example"
    for url in (f"/?done={spoof}", f"/runs?done={spoof}", f"/queues?done={spoof}&sig=AAAA"):
        page = http.get(url)
        assert page.status_code == 200 and "evil.example" not in page.text
    run_id = engine.start_workflow(waiting)
    acted = http.post(f"/runs/{run_id}/cancel", data={"reason": "x"}, headers=SAME_ORIGIN, follow_redirects=False)
    assert acted.status_code == 303
    assert "cancel requested" in http.get(acted.headers["location"]).text  # the app's own note is shown
    location = acted.headers["location"]
    signature = location.rsplit("sig=", 1)[1]
    # the signature of one note does not carry another
    assert "evil.example" not in http.get(f"/runs/{run_id}?done={spoof}&sig={signature}").text
    healthy_run_completes(engine, http)


def test_the_session_cookie_says_when_it_was_issued_and_expires(engine: dex.Engine) -> None:
    app = create_app(engine, token=TOKEN, session_lifetime=timedelta(hours=2))
    with client(app) as http:
        response = http.post("/signin", data={"token": TOKEN, "next": "/"}, headers=SAME_ORIGIN, follow_redirects=False)
        header = response.headers["set-cookie"]
        assert "max-age=7200" in header.lower() and TOKEN not in header
        issued, expires, _ = response.cookies[COOKIE].split(".")
        assert int(expires) - int(issued) == 7200 and abs(int(issued) - time.time()) < 600
        assert http.get("/v1/runs").status_code == 200
    now = time.time()
    fixed = hmac.new(TOKEN.encode(), b"dex web session v1", hashlib.sha256).hexdigest()  # the old, eternal cookie
    refused = {
        "expired": session_value(TOKEN, now - 3 * 3600, timedelta(hours=2)),
        "issued in the future": session_value(TOKEN, now + 3600, timedelta(hours=2)),
        "the old fixed value": fixed,
        "another token's": session_value("other-token", now, timedelta(hours=2)),
        "expiry pushed back": _with_expiry(session_value(TOKEN, now - 3 * 3600, timedelta(hours=2)), now + 3600),
        "garbage": "1.2.3.4",
    }
    for why, value in refused.items():
        with client(app, cookies={COOKIE: value}) as http:
            assert http.get("/v1/runs").status_code == 401, why
            assert http.get("/runs", follow_redirects=False).status_code == 303, why
    with client(app, cookies={COOKIE: session_value(TOKEN, now - 3600, timedelta(hours=2))}) as http:
        assert http.get("/v1/runs").status_code == 200  # an hour old of two: still good
        healthy_run_completes(engine, http)


def _with_expiry(value: str, expires: float) -> str:
    issued, _, signature = value.split(".")
    return f"{issued}.{int(expires)}.{signature}"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_wrong_tokens_at_the_sign_in_form_are_limited_per_client(engine: dex.Engine) -> None:
    clock = FakeClock()
    limiter = SignInLimiter(max_failures=3, window=timedelta(minutes=5), clock=clock)
    app = create_app(engine, token=TOKEN, signin_limiter=limiter)
    with client(app) as guesser, client(app, client=("10.0.0.2", 40000)) as other:
        for attempt in range(3):
            clock.now += 1
            wrong = guesser.post("/signin", data={"token": f"guess-{attempt}"}, headers=SAME_ORIGIN)
            assert wrong.status_code == 401
        for token in ("guess-3", TOKEN):  # held: even the right token is not looked at
            held = guesser.post("/signin", data={"token": token}, headers=SAME_ORIGIN, follow_redirects=False)
            assert held.status_code == 429 and COOKIE not in held.cookies
            assert held.headers["retry-after"] == str(300 - 2)  # until the first failure is 5 minutes old
            assert "try again in" in held.text
        # another client is not held, nor is the API's bearer token
        assert (
            other.post("/signin", data={"token": TOKEN}, headers=SAME_ORIGIN, follow_redirects=False).status_code == 303
        )
        assert guesser.get("/v1/runs", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
        clock.now += 300
        signed = guesser.post("/signin", data={"token": TOKEN}, headers=SAME_ORIGIN, follow_redirects=False)
        assert signed.status_code == 303 and COOKIE in signed.cookies
        healthy_run_completes(engine, guesser)


def test_the_limiter_forgets_on_success_and_remembers_a_bounded_number_of_clients() -> None:
    clock = FakeClock()
    limiter = SignInLimiter(max_failures=2, window=timedelta(minutes=1), max_clients=2, clock=clock)
    limiter.failed("a")
    limiter.succeeded("a")
    limiter.failed("a")
    assert limiter.retry_after("a") is None  # one failure since the success
    limiter.failed("a")
    assert limiter.retry_after("a") == 60
    limiter.failed("b")
    limiter.failed("c")  # a third client: the longest remembered ("a") is forgotten
    assert limiter.retry_after("a") is None
    limiter.failed("c")
    assert limiter.retry_after("c") == 60
    for bad in ({"max_failures": 0}, {"window": timedelta(0)}, {"max_clients": True}):
        with pytest.raises(ValueError):
            SignInLimiter(**bad)
