"""The HTTP API's pure parts: the committed contract, event building, keys, rate limits,
problem details and webhook signatures and targets."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import msgspec
import pytest

from contextlog.producers.commands import Encoder
from contextlog.producers.ids import derived_id
from contextlog.schema import events as ev
from contextlog.schema.errors import EventRejected, NotVisible, Refused, Unavailable
from contextlog.schema.notices import Notice
from contextlog.worker.api import commands, contract, keys
from contextlog.worker.api import models as m
from contextlog.worker.api.limits import RateLimiter
from contextlog.worker.api.problems import ApiError, from_error
from contextlog.worker.app.clock import FakeClock
from contextlog.worker.effects import webhooks as wh
from contextlog.worker.tasks.webhooks import Webhook

DOCS = Path(__file__).resolve().parents[2] / "docs"
NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize("name", sorted(contract.files()))
def test_the_committed_contract_is_what_the_code_generates(name: str) -> None:
    committed = (DOCS / name).read_bytes() if (DOCS / name).exists() else b""
    assert committed == contract.files()[name], (
        f"docs/{name} drifted from the code: run `python -m contextlog.worker.api.contract` "
        "and commit the result"
    )


def test_every_operation_names_its_right_and_documents_its_refusals() -> None:
    doc = msgspec.json.decode(contract.files()["openapi.json"])
    ops = [op for path in doc["paths"].values() for op in path.values()]
    assert len({op["operationId"] for op in ops}) == len(ops)
    for op in ops:
        if "security" in op:
            assert {"401", "403", "429"} <= set(op["responses"]), op["operationId"]
        assert "503" in op["responses"]


def test_an_external_id_or_idempotency_key_fixes_the_event_id() -> None:
    body = m.MessageIn(role="user", content="hi", source="bot")
    keyed = commands.build("message", "a", "c", body, NOW, "k-1")
    assert keyed.event_id == derived_id("bot", "k-1")
    assert isinstance(keyed, ev.MessagePosted) and keyed.external_id == "k-1"
    own = msgspec.structs.replace(body, external_id="m-9")
    assert commands.build("message", "a", "c", own, NOW, "k-1").event_id == derived_id("bot", "m-9")
    fresh = [commands.build("clear", "a", "c", m.ClearIn(), NOW).event_id for _ in range(2)]
    assert fresh[0] != fresh[1]


def test_content_blocks_reach_the_log_byte_for_byte() -> None:
    raw = b'{"role":"user","content":[{"type":"text","text":"x","z":1.50,"a":{}}]}'
    body = msgspec.json.decode(raw, type=m.MessageIn)
    (prepared,) = commands.prepare_all(Encoder(4), [commands.build("message", "a", "c", body, NOW)])
    assert b'[{"type":"text","text":"x","z":1.50,"a":{}}]' in prepared.payload


def test_a_bad_batch_item_is_named() -> None:
    items: list[m.Item] = [
        m.ClearItem(agent="a", channel="c"),
        m.MessageItem(agent="a", channel="c", role="x", content="y"),
    ]
    with pytest.raises(ApiError) as e:
        commands.prepare_all(Encoder(4), commands.batch(items, NOW, None))
    assert (e.value.status, e.value.item, e.value.reason) == (422, 1, "invalid")


def test_library_errors_map_to_statuses() -> None:
    assert from_error(EventRejected("invalid", "x")).status == 422
    assert from_error(Refused("no")).status == 409
    for error in (NotVisible("late"), Unavailable("down")):
        mapped = from_error(error)
        assert mapped.status == 503 and mapped.headers()["Retry-After"] == "1"


def test_tokens_and_scopes() -> None:
    key_id, token, digest = keys.new_token()
    assert keys.parse_token(token)[0] == key_id
    key = keys.ApiKey(key_id, digest, "", ["a"], ["c"], ["read"], NOW, None)
    assert keys.matches(key, keys.parse_token(token)[1])
    assert not keys.matches(key, "guess")
    assert key.allows("a", "c") and not key.allows("a", "d") and not key.allows("a", None)
    assert not key.allows("b", "c")
    with pytest.raises(ApiError, match="lacks the 'post' right"):
        key.check("post")
    with pytest.raises(ValueError, match="rights must be"):
        keys.check_scope(["a"], None, ["root"])
    with pytest.raises(ApiError):
        keys.parse_token("sk-not-ours")


def test_the_rate_limit_refills_with_time() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate=2, burst=2, monotonic=clock.monotonic)
    assert [limiter.wait("k") for _ in range(3)] == [0, 0, 0.5]
    with pytest.raises(ApiError) as e:
        limiter.check("k")
    assert e.value.status == 429 and e.value.headers()["Retry-After"] == "1"
    assert limiter.wait("other") == 0
    clock.advance(1)
    assert limiter.wait("k") == 0


def test_signatures_match_the_standard_webhooks_vector() -> None:
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    signature = wh.sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": f"v1,bogus= {signature}",
    }
    assert wh.verify(secret, headers, body, now=1614265330 + 60)
    assert not wh.verify(secret, headers, body + b" ", now=1614265330)
    assert not wh.verify(secret, headers, body, now=1614265330 + 301)


def test_targets_are_restricted() -> None:
    public = lambda host: ["93.184.216.34"]  # noqa: E731
    local = lambda host: ["127.0.0.1"]  # noqa: E731
    wh.check_target("https://hooks.example.com/x", (), False, public)
    wh.check_target("https://a.example.com/x", ("*.example.com",), False, public)
    with pytest.raises(wh.TargetRefused, match="CONTEXTLOG_WEBHOOK_HOSTS"):
        wh.check_target("https://evil.test/x", ("*.example.com",), False, public)
    with pytest.raises(wh.TargetRefused, match="not a public address"):
        wh.check_target("http://localhost:8080/x", (), False, local)
    wh.check_target("http://localhost:8080/x", (), True, local)
    for bad in ("ftp://h/x", "http://u:p@h/x", "nohost"):
        with pytest.raises(wh.TargetRefused):
            wh.check_target(bad, (), True, public)


def test_a_webhook_wants_its_kinds_agents_channels_and_later_notices() -> None:
    hook = Webhook("wh_1", "u", "s", ["session_saved"], ["a"], ["c"], "whsec_", None, NOW)
    notice = Notice(notice_id="n", kind="session_saved", agent="a", channel="c", occurred_at=NOW)
    assert hook.wants(notice)
    assert not hook.wants(msgspec.structs.replace(notice, kind="summary_ready"))
    assert not hook.wants(msgspec.structs.replace(notice, agent="b"))
    assert not hook.wants(msgspec.structs.replace(notice, channel="d"))
    earlier = NOW - dt.timedelta(seconds=1)
    assert not hook.wants(msgspec.structs.replace(notice, occurred_at=earlier))
    assert wh.delivery_id("wh_1", "n") == wh.delivery_id("wh_1", "n") != wh.delivery_id("wh_2", "n")
