"""The HTTP API on real Postgres and Redis, ingest in a thread: the same results as the
library, idempotent posts, problem details, scoped keys (403 for every resource of
another agent), limits, notifications resumed by Last-Event-ID."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis

from contextlog.producers import ContextReader
from contextlog.schema import keys as rkeys
from contextlog.worker.api import keys
from contextlog.worker.api.routes import ENDPOINTS
from tests.support.api import Api, make_key, serving
from tests.support.readers import indexed
from tests.support.running import eventually, running, settings_for

A, C = "alpha", "general"
CONV = f"/v1/agents/{A}/channels/{C}"


@pytest.fixture
def api(db: str, redis_url: str) -> Iterator[Api]:
    settings = settings_for(
        db, redis_url, CONTEXTLOG_API_MAX_BODY="4096", CONTEXTLOG_API_BURST="1000"
    )
    with running(settings), serving(settings) as a:
        yield a


@pytest.fixture
def token(db: str) -> str:
    return make_key(db, [A], "post,read,sessions,admin")


def post(api: Api, token: str, path: str, body: Any, **headers: str) -> Any:
    return api.client.post(path, json=body, headers=api.headers(token, **headers))


def get(api: Api, token: str, path: str, **params: Any) -> Any:
    return api.client.get(path, params=params, headers=api.headers(token))


def say(api: Api, token: str, text: str, **extra: Any) -> str:
    r = post(
        api, token, CONV + "/messages", {"role": "user", "content": text, "source": "t", **extra}
    )
    assert r.status_code == 202, r.text
    return str(r.json()["event_id"])


def test_a_turn_reads_what_the_library_reads(api: Api, token: str, db: str) -> None:
    blocks = [
        {"type": "text", "text": "look", "citations": None},
        {"type": "text", "text": "at this"},
    ]
    say(api, token, "hello")
    r = post(api, token, CONV + "/messages", {"role": "assistant", "content": blocks})
    last = r.json()["event_id"]
    got = get(api, token, CONV + "/context", wait_for=last, timeout=10)
    assert got.status_code == 200, got.text
    reader = ContextReader.from_url(db)
    try:
        ctx = reader.context(A, C)
    finally:
        reader.close()
    body = got.json()
    assert body["messages"] == ctx.messages
    assert body["token_estimate"] == ctx.token_estimate
    assert body["truncated"] is ctx.truncated
    tools = [{"name": "t", "description": "d", "input_schema": {"type": "object"}}]
    req = post(
        api,
        token,
        CONV + "/context/request",
        {"system": "Be brief.", "tools": tools, "cache": True},
    )
    assert req.status_code == 200, req.text
    assert req.json()["request"] == json.loads(
        json.dumps(ctx.to_anthropic(system="Be brief.", tools=tools, cache=True))
    )


def test_a_turn_in_one_request(api: Api, token: str, db: str) -> None:
    say(api, token, "earlier")
    body = {"role": "user", "content": "and now?", "source": "t", "system": "Be brief."}
    r = post(api, token, CONV + "/turn", body)
    assert r.status_code == 200, r.text
    out = r.json()
    reader = ContextReader.from_url(db)
    try:
        expected = reader.context(A, C).to_anthropic(system="Be brief.")
    finally:
        reader.close()
    assert (
        out["request"] == expected
        and out["request"]["messages"][-1]["content"][-1]["text"] == "and now?"
    )
    poster = make_key(db, [A], "post")
    assert post(api, poster, CONV + "/turn", body).status_code == 403  # needs read too


def read(api: Api, token: str, **params: Any) -> Any:
    """A context read that must succeed (a problem detail says why if it does not)."""
    got = get(api, token, CONV + "/context", timeout=10, **params)
    assert got.status_code == 200, got.text
    return got.json()


def test_thinking_system_messages_the_frame_and_boundaries_over_http(
    api: Api, token: str, db: str
) -> None:
    """A bot of a preserved-thinking model over HTTP: its thinking comes back verbatim, a
    `role: system` message stays in place (or folds into the user turn), the registered
    frame is the request's system and tools, and another frame or a clear is a boundary
    the read names."""
    tools = [{"name": "t", "description": "d", "input_schema": {"type": "object"}}]
    thinks = {"type": "enabled", "budget_tokens": 2048}
    frame: dict[str, Any] = {
        "model": "x",
        "system": "Be brief.",
        "tools": tools,
        "thinking": thinks,
    }
    framed = api.client.put(CONV + "/frame", json=frame, headers=api.headers(token))
    assert framed.status_code == 202, framed.text
    thinking = {"type": "thinking", "thinking": "Hmm.", "signature": "c2ln"}
    say(api, token, "hello")
    note = {"role": "system", "content": "The user is on mobile."}
    assert post(api, token, CONV + "/messages", note).status_code == 202
    answer = {"role": "assistant", "content": [thinking, {"type": "text", "text": "Hi."}]}
    last = post(api, token, CONV + "/messages", answer).json()["event_id"]
    body = read(api, token, wait_for=last)
    assert [m["role"] for m in body["messages"]] == ["user", "system", "assistant"]
    assert body["messages"][1]["content"] == [{"type": "text", "text": note["content"]}]
    assert body["messages"][2]["content"][0] == thinking and body["boundary"] is None
    folded = get(api, token, CONV + "/context", system_messages="fold").json()["messages"]
    assert [m["role"] for m in folded] == ["user", "assistant"]
    assert note["content"] in folded[0]["content"][-1]["text"]
    assert get(api, token, CONV + "/context", system_messages="drop").status_code == 422
    req = post(api, token, CONV + "/context/request", {}).json()["request"]
    assert req["system"] == "Be brief." and req["tools"] == tools
    changed = api.client.put(
        CONV + "/frame", json={**frame, "system": "Be briefer."}, headers=api.headers(token)
    )
    out = read(api, token, wait_for=changed.json()["event_id"])
    assert out["boundary"]["kind"] == "frame" and out["thinking_removed"] == 1
    assert thinking not in out["messages"][-1]["content"]
    cleared = post(api, token, CONV + "/clear", {"source": "t"}).json()["event_id"]
    empty = read(api, token, wait_for=cleared)
    assert empty["messages"] == [] and empty["boundary"]["kind"] == "clear"
    assert empty["boundary"]["count"] == out["boundary"]["count"] + 1
    bad = api.client.put(CONV + "/frame", json={"model": ""}, headers=api.headers(token))
    assert bad.status_code == 422


def test_search_retention_and_erase_over_http(api: Api, token: str, db: str) -> None:
    """Issue 34 over HTTP: a search of the agent's conversations, a conversation's own
    retention (an admin's), and an erase of a sender that the search then no longer finds;
    a key without `admin` may do neither of the last two."""
    say(api, token, "the rollback plan is ready", sender="ann")
    last = say(api, token, "the rollout waits", sender="bob")
    read(api, token, wait_for=last)
    indexed(db)
    found = get(api, token, f"/v1/agents/{A}/search", q="rollback", channel=C)
    assert found.status_code == 200, found.text
    page = found.json()
    assert [h["sender"] for h in page["hits"]] == ["ann"] and "**rollback**" in str(page)
    assert get(api, token, f"/v1/agents/{A}/search", q="-rollback").status_code == 409
    reader = make_key(db, [A], "post,read")
    keep = {"keep_log_days": 30, "source": "t"}
    assert (
        api.client.put(CONV + "/retention", json=keep, headers=api.headers(reader)).status_code
        == 403
    )
    kept = api.client.put(CONV + "/retention", json=keep, headers=api.headers(token))
    assert kept.status_code == 202, kept.text
    assert post(api, reader, f"/v1/agents/{A}/erase", {"sender": "ann"}).status_code == 403
    erased = post(api, token, f"/v1/agents/{A}/erase", {"sender": "ann", "source": "t"})
    assert erased.status_code == 202, erased.text
    assert len(erased.json()["event_ids"]) == 4  # one an inbound shard
    assert post(api, token, f"/v1/agents/{A}/erase", {}).status_code == 422  # erase what?

    def gone() -> bool:
        indexed(db)
        got = get(api, token, f"/v1/agents/{A}/search", q="rollback OR rollout")
        assert got.status_code == 200, got.text
        senders = [h["sender"] for h in got.json()["hits"]]
        return "ann" not in senders and "bob" in senders

    eventually(gone, what="ann's words erased from search")
    with psycopg.connect(db) as conn:
        (n,) = conn.execute(
            "SELECT count(*) FROM events WHERE payload::text LIKE '%%rollback plan%%'"
        ).fetchone() or (0,)
    assert n == 0


def test_posts_are_idempotent_by_external_id_or_idempotency_key(
    api: Api, token: str, db: str
) -> None:
    first = say(api, token, "once", external_id="m-1")
    assert say(api, token, "once", external_id="m-1") == first
    keyed = post(api, token, CONV + "/clear", {"source": "t"}, **{"Idempotency-Key": "k-1"})
    again = post(api, token, CONV + "/clear", {"source": "t"}, **{"Idempotency-Key": "k-1"})
    assert keyed.json() == again.json()
    get(api, token, CONV + "/context", wait_for=keyed.json()["event_id"], timeout=10)
    with psycopg.connect(db) as conn:
        ids = [first, keyed.json()["event_id"]]
        (n,) = conn.execute(
            "SELECT count(*) FROM events WHERE event_id::text = ANY(%s)", (ids,)
        ).fetchone() or (0,)
    assert n == 2


def test_a_batch_with_one_bad_item_sends_nothing_and_names_it(
    api: Api, token: str, rds: redis.Redis
) -> None:
    items = [
        {"type": "message", "agent": A, "channel": C, "role": "user", "content": "fine"},
        {
            "type": "message",
            "agent": A,
            "channel": C,
            "role": "user",
            "content": [{"type": "text"}],
        },
    ]
    r = post(api, token, "/v1/batch", {"items": items})
    assert r.status_code == 422
    problem = r.json()
    assert r.headers["content-type"] == "application/problem+json"
    assert (problem["item"], problem["error"], problem["reason"]) == (1, "EventRejected", "invalid")
    assert sum(rds.xlen(rkeys.stream(s)) for s in range(4)) == 0
    clear = {"type": "clear", "agent": A, "channel": C}
    ok = post(api, token, "/v1/batch", {"items": [items[0], clear]})
    assert ok.status_code == 202 and len(ok.json()["event_ids"]) == 2


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        ({"role": "robot", "content": "x"}, 422, "event-rejected"),  # the library's refusal
        ({"content": "x"}, 422, "invalid-request"),  # the contract's
        ({"role": "user", "content": "x", "surprise": 1}, 422, "invalid-request"),
        ({"role": "user", "content": "x" * 5000}, 413, "body-too-large"),
    ],
)
def test_bad_input_gets_a_problem_detail(
    api: Api, token: str, body: Any, status: int, kind: str
) -> None:
    r = post(api, token, CONV + "/messages", body)
    assert r.status_code == status, r.text
    assert r.json()["type"].endswith("/" + kind)
    assert "Traceback" not in r.text


def test_malformed_json_unknown_routes_and_methods_are_problems(api: Api, token: str) -> None:
    bad = api.client.post(CONV + "/messages", content=b"{nope", headers=api.headers(token))
    assert bad.status_code == 400 and bad.json()["reason"] == "malformed"
    assert api.client.get("/v1/nothing").status_code == 404
    assert api.client.put(CONV + "/messages", headers=api.headers(token)).status_code == 405


def test_keys_unknown_revoked_and_missing_get_401(api: Api, token: str, db: str) -> None:
    assert api.client.get(CONV + "/context").status_code == 401
    assert (
        api.client.get(CONV + "/context", headers={"Authorization": "Bearer x"}).status_code == 401
    )
    forged = token[: token.rindex("_") + 1] + "A" * 43
    assert api.client.get(CONV + "/context", headers=api.headers(forged)).status_code == 401
    victim = make_key(db, [A])
    assert get(api, victim, CONV + "/context").status_code == 200
    with psycopg.connect(db) as conn:
        keys.revoke(conn, victim.split("_")[1])
    api.services.keys._cache.clear()  # what CONTEXTLOG_API_KEY_CACHE seconds do
    r = get(api, victim, CONV + "/context")
    assert r.status_code == 401 and "revoked" in r.json()["detail"]


def _path(template: str, agent: str, channel: str) -> str:
    values = {
        "agent": agent,
        "channel": channel,
        "session_id": "s",
        "webhook_id": "w",
        "delivery_id": "d",
    }
    return re.sub(r"{(\w+)}", lambda m: values[m[1]], template)


AGENT_ROUTES = [e for e in ENDPOINTS if "{agent}" in e.path]


@pytest.mark.parametrize("endpoint", AGENT_ROUTES, ids=[e.name for e in AGENT_ROUTES])
def test_a_key_of_one_agent_is_refused_on_every_resource_of_another(
    api: Api, db: str, endpoint: Any
) -> None:
    token = make_key(db, [A], "post,read,sessions,admin")
    narrow = make_key(db, [A], "post,read,sessions", channels=[C])
    query = {"source": "t"} if endpoint.name == "streamNotifications" else {}
    cases = [(token, "beta", C), (narrow, A, "other")]
    if endpoint.agent_wide or "{channel}" not in endpoint.path:
        cases = cases[:1]
    for key, agent, channel in cases:
        r = api.client.request(
            endpoint.method,
            _path(endpoint.path, agent, channel),
            params=query,
            json={},
            headers=api.headers(key),
        )
        assert r.status_code == 403, (endpoint.name, agent, channel, r.text)


def test_rights_and_other_scopes_are_refused(api: Api, db: str) -> None:
    reader = make_key(db, [A], "read")
    assert (
        post(api, reader, CONV + "/messages", {"role": "user", "content": "x"}).status_code == 403
    )
    assert post(api, reader, CONV + "/sessions", {}).status_code == 403
    assert get(api, reader, "/v1/status").status_code == 403
    poster = make_key(db, [A], "post")
    item = {"type": "message", "agent": "beta", "channel": C, "role": "user", "content": "x"}
    assert post(api, poster, "/v1/batch", {"items": [item]}).status_code == 403
    save = {"type": "save", "agent": A, "channel": C}
    assert post(api, poster, "/v1/batch", {"items": [save]}).status_code == 403
    narrow = make_key(db, [A], "sessions", channels=[C])
    assert get(api, narrow, f"/v1/agents/{A}/sessions").status_code == 403  # agent-wide
    assert get(api, narrow, f"/v1/agents/{A}/sessions", channel=C).status_code == 200
    admin = make_key(db, [A], "admin")
    hook = {
        "url": "http://127.0.0.1:9/x",
        "source": "t",
        "kinds": ["session_saved"],
        "agents": ["beta"],
    }
    assert post(api, admin, "/v1/webhooks", hook).status_code == 403


def test_rate_limit_answers_429_with_retry_after(db: str, redis_url: str) -> None:
    settings = settings_for(db, redis_url, CONTEXTLOG_API_RATE="0.01", CONTEXTLOG_API_BURST="2")
    token = make_key(db, [A])
    with serving(settings) as api:
        codes = [get(api, token, CONV + "/settings").status_code for _ in range(3)]
        r = get(api, token, CONV + "/settings")
        other = get(api, make_key(db, [A]), CONV + "/settings")
    assert codes == [200, 200, 429]
    assert r.status_code == 429 and int(r.headers["Retry-After"]) == 100
    assert other.status_code == 200  # per key


def test_page_size_and_wait_for_are_bounded(api: Api, token: str) -> None:
    r = get(api, token, f"/v1/agents/{A}/sessions", per_page=101)
    assert r.status_code == 422
    r = get(api, token, CONV + "/context", wait_for="not-a-uuid")
    assert r.status_code == 422
    r = get(
        api, token, CONV + "/context", wait_for="01a21823-55ae-735d-8adb-97956132b436", timeout=0.2
    )
    assert r.status_code == 503 and r.json()["error"] == "NotVisible" and "Retry-After" in r.headers


def test_settings_sessions_export_import_and_notifications(api: Api, token: str) -> None:
    changed = post(api, token, CONV + "/settings", {})
    assert changed.status_code == 405  # PATCH, not POST
    eid = api.client.patch(
        CONV + "/settings", json={"token_budget": 5000}, headers=api.headers(token)
    ).json()["event_id"]
    get(api, token, CONV + "/context", wait_for=eid, timeout=10)
    assert get(api, token, CONV + "/settings").json()["token_budget"] == 5000
    say(api, token, "remember the blue door")
    saved = post(api, token, CONV + "/sessions", {"description": "door", "source": "t"}).json()[
        "event_id"
    ]
    get(api, token, CONV + "/context", wait_for=saved, timeout=10)
    page = get(api, token, f"/v1/agents/{A}/sessions", channel=C).json()
    (session,) = page["sessions"]
    sid = session["session_id"]
    assert get(api, token, f"{CONV}/sessions/{sid}").json()["description"] == "door"
    assert get(api, token, f"{CONV}/sessions/nope").status_code == 409
    exported = get(api, token, f"{CONV}/sessions/{sid}/export").json()
    assert exported["messages"][0]["content"] == "remember the blue door"
    imported = post(api, token, f"/v1/agents/{A}/channels/other/sessions/import?source=t", exported)
    assert imported.status_code == 202, imported.text
    bad = post(
        api,
        token,
        f"/v1/agents/{A}/channels/other/sessions/import",
        {**exported, "message_count": 9},
    )
    assert bad.status_code == 422
    # notifications: the save's notice, again until acknowledged by Last-Event-ID
    path = f"/v1/agents/{A}/notifications"
    first = _events(api, token, path, {"source": "t", "limit": 1})
    assert first[0][1]["kind"] == "session_saved"
    again = _events(api, token, path, {"source": "t", "limit": 1})
    assert again == first
    after = _events(api, token, path, {"source": "t", "limit": 1}, last=first[0][0])
    assert after[0][1]["kind"] == "session_imported" and after[0][0] > first[0][0]
    acked = post(api, token, path + "/ack", {"source": "t", "through": after[0][0]})
    assert acked.json() == {"acked": 1}
    restored = post(api, token, f"{CONV}/sessions/{sid}/restore", {"source": "t"})
    deleted = api.client.request(
        "DELETE", f"{CONV}/sessions/{sid}", json={"source": "t"}, headers=api.headers(token)
    )
    purged = post(api, token, f"{CONV}/sessions/purge", {"keep": 0, "source": "t"})
    assert [x.status_code for x in (restored, deleted, purged)] == [202, 202, 202]


def _events(
    api: Api, token: str, path: str, params: dict[str, Any], last: str | None = None
) -> list[tuple[str, Any]]:
    headers = api.headers(token, **({"Last-Event-ID": last} if last else {}))
    with api.client.stream("GET", path, params=params, headers=headers) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    out = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if not line.startswith(":")
        )
        if "data" in fields:
            out.append((fields["id"], json.loads(fields["data"])))
    return out


def test_health_and_the_served_document(api: Api, token: str) -> None:
    assert api.client.get("/v1/health").json() == {"ok": True, "redis": True, "postgres": True}
    served = api.client.get("/v1/openapi.json").json()
    assert served["openapi"] == "3.1.0"
    status = get(api, token, "/v1/status")
    assert status.status_code == 200 and "shards" in status.json()
