"""Erase (issue 34.3) on real Postgres, applied as ingest applies it: a sender across an
agent's conversations (and the exchanges they opened), a session's messages, a whole
conversation; what is derived from them made again (sessions, summaries, compactions,
headers, search, attachments); contexts still valid for the API; rebuild gives the same
erased state; a summary written before the erase never lands."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from contextlog.producers import ContextReader
from contextlog.producers.ids import uuid7
from contextlog.schema import attachments, codec, erasure, keys
from contextlog.schema import events as ev
from contextlog.schema import notices as nt
from contextlog.worker.cli import main as cli
from contextlog.worker.ingest.streams import Streams
from contextlog.worker.store.eventlog import Accepted
from contextlog.worker.store.rebuild import rebuild
from tests.support import canary, snapshots
from tests.support.anthropic_rules import check_messages
from tests.support.fake_anthropic import Outcome
from tests.support.readers import indexed
from tests.support.session_stack import A, C, Stack
from tests.support.thinking_bot import Log

T0 = LOG_START = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)
SHARDS = 4
CANARY = "zq-canary-ann-7731"
OTHER = "zq-canary-bob-4410"
PICTURE = b"\x89PNG" + CANARY.encode() * 64


def tick(lg: Log) -> None:
    lg.now += MINUTE


def picture(lg: Log, data: bytes, channel: str, sender: str) -> None:
    sha = hashlib.sha256(data).hexdigest()
    source = {"type": "base64", "media_type": "image/png", "data": ""}
    raw = json.dumps(
        {
            "type": "message.v1",
            "event_id": str(uuid7()),
            "agent": "alpha",
            "channel": channel,
            "sender": sender,
            "occurred_at": lg.now.isoformat(),
            "role": "user",
            "content": [
                {"type": "image", "source": attachments.reference(source, sha, len(data))},
                {"type": "text", "text": f"my picture {CANARY if sender == 'ann' else OTHER}"},
            ],
        }
    ).encode()
    lg.log.append(0, 1, [Accepted("7-0", codec.decode(raw), raw, {sha: data})])


def exchange(lg: Log, channel: str, sender: str, canary: str, n: int) -> None:
    """A user's question, a tool call and its result, the answer."""
    lg.say("user", f"{sender} asks about {canary}", channel=channel, sender=sender)
    tick(lg)
    lg.say(
        "assistant",
        [
            {"type": "text", "text": "let me look"},
            {
                "type": "tool_use",
                "id": f"toolu_{channel}_{n}",
                "name": "lookup",
                "input": {"q": canary},
            },
        ],
        channel=channel,
    )
    lg.say(
        "user",
        [
            {
                "type": "tool_result",
                "tool_use_id": f"toolu_{channel}_{n}",
                "content": f"found {canary}",
            }
        ],
        channel=channel,
    )
    lg.say("assistant", f"here is what I know of {canary}", channel=channel)
    tick(lg)


def erase(lg: Log, **kw: Any) -> list[ev.EraseRequested]:
    events = erasure.request("alpha", shards=SHARDS, now=lg.now, **kw)
    for e in events:
        lg.add(
            ev.EraseRequested,
            channel=e.channel,
            event_id=e.event_id,
            erase_id=e.erase_id,
            scope=e.scope,
            subject=e.subject,
            session=e.session,
            shard=e.shard,
            shards=e.shards,
        )
    return events


def everything(db: str) -> str:
    """Every row of every table, as text (what a person with the database would see)."""
    with psycopg.connect(db) as conn:
        tables = [
            t
            for (t,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        ]
        return "\n".join(str(row) for t in tables for row in conn.execute(f'SELECT * FROM "{t}"'))


def test_a_sender_is_erased_everywhere_and_the_others_stay(
    db: str, log: Log, reader: ContextReader
) -> None:
    for channel in ("general", "random", "dm-ann"):
        exchange(log, channel, "ann", CANARY, 1)
        exchange(log, channel, "bob", OTHER, 2)
    picture(log, PICTURE, "general", "ann")
    log.add(ev.SessionSaveRequested, channel="general")  # a session holding both
    sid = reader.sessions("alpha", "general").sessions[0].session_id
    log.add(ev.SummaryGenerated, channel="general", session_id=sid, summary=f"ann: {CANARY}")
    log.add(ev.SearchRequested, channel="general", query=CANARY, sender="ann")
    erase(log, sender="ann")
    text = everything(db)
    assert CANARY not in text and CANARY.encode().hex() not in text
    assert OTHER in text
    for channel in ("general", "random", "dm-ann"):
        ctx = reader.context("alpha", channel)
        assert check_messages(ctx.messages) == []
        shown = json.dumps(ctx.to_anthropic())
        assert CANARY not in shown and OTHER in shown
        assert ctx.boundary is not None and ctx.boundary.kind == "erase"
    indexed(db)
    assert reader.search("alpha", CANARY).total == 0
    assert reader.search("alpha", OTHER).total == 12  # 4 a channel: question, input, result, answer
    [session] = reader.sessions("alpha", "general").sessions
    assert session.session_id == sid and session.summary is None  # to be written again
    live, rows = snapshots.derived(db), snapshots.log(db)
    with psycopg.connect(db) as conn:
        rebuild(conn)
    assert snapshots.derived(db) == live and snapshots.log(db) == rows


def test_a_session_is_erased_and_the_sessions_sharing_its_messages_are_summarised_again(
    db: str, log: Log, reader: ContextReader
) -> None:
    exchange(log, "general", "ann", CANARY, 1)
    log.add(ev.SessionSaveRequested, channel="general", description="first part")
    exchange(log, "general", "bob", OTHER, 2)
    log.add(ev.SessionSaveRequested, channel="general", description="both parts")
    first, both = (s.session_id for s in reversed(reader.sessions("alpha", "general").sessions))
    log.add(ev.SummaryGenerated, channel="general", session_id=both, summary=f"{CANARY} {OTHER}")
    log.add(ev.ContextCleared, channel="general")
    log.add(ev.SessionRestoreRequested, channel="general", session_id=both)
    erase(log, channel="general", session_id=first)
    assert CANARY not in everything(db)
    assert [s.session_id for s in reader.sessions("alpha", "general")] == [both]
    ctx = reader.context("alpha", "general")
    assert check_messages(ctx.messages) == [] and CANARY not in json.dumps(ctx.to_anthropic())
    assert OTHER in json.dumps(ctx.messages)  # bob's part of the restored session stays
    assert "its summary was removed" in (ctx.system or "")
    live = snapshots.derived(db)
    with psycopg.connect(db) as conn:
        rebuild(conn)
    assert snapshots.derived(db) == live


def test_a_conversation_is_dropped_whole_and_starts_afresh(
    db: str, log: Log, reader: ContextReader
) -> None:
    exchange(log, "dm-ann", "ann", CANARY, 1)
    picture(log, PICTURE, "dm-ann", "ann")
    picture(log, b"\x89PNG" + OTHER.encode() * 64, "general", "bob")
    erase(log, channel="dm-ann")
    assert CANARY not in everything(db)
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM attachments").fetchone() == (1,)
    log.say("user", "hello again", channel="dm-ann")
    assert [m["content"] for m in reader.context("alpha", "dm-ann").messages] == [
        [{"type": "text", "text": "hello again"}]
    ]
    live = snapshots.derived(db)
    with psycopg.connect(db) as conn:
        rebuild(conn)
    assert snapshots.derived(db) == live


def delivery(
    conn: psycopg.Connection[Any],
    channel: str,
    kind: str,
    text: str,
    n: int,
    agent: str = "alpha",
    **data: str,
) -> None:
    """A webhook delivery of a notice about `channel`, as the dispatcher stores it."""
    data = {"agent": agent, "channel": channel, "kind": kind, "text": text, **data}
    body = {"type": kind, "timestamp": "2026-03-01T00:00:00Z", "data": data}
    conn.execute(
        "INSERT INTO webhook_deliveries"
        " (delivery_id, webhook_id, notice_id, kind, payload, agent, channel)"
        " VALUES (%s, 'wh_1', %s, %s, %s, %s, %s)",
        (f"d{n}", f"n{n}", kind, json.dumps(body).encode(), agent, channel),
    )


def webhook(conn: psycopg.Connection[Any]) -> None:
    """The webhook those deliveries belong to."""
    conn.execute(
        "INSERT INTO webhooks (webhook_id, url, source, kinds, agents, secret)"
        " VALUES ('wh_1', 'https://example.com/h', 'bot', '{summary_ready}', '{alpha}', 'x')"
    )


def test_an_erase_reaches_the_webhook_deliveries_of_its_notices(db: str, log: Log) -> None:
    with psycopg.connect(db) as conn:
        webhook(conn)
        delivery(conn, "dm-ann", "summary_ready", f"they talked about {CANARY}", 1)
        delivery(conn, "general", "summary_ready", f"they talked about {OTHER}", 2)
    exchange(log, "dm-ann", "ann", CANARY, 1)
    erase(log, channel="dm-ann")
    text = everything(db)
    assert CANARY not in text and OTHER in text  # the other conversation's stays


def test_a_summary_written_before_the_erase_never_lands(db: str, log: Log) -> None:
    exchange(log, "general", "ann", CANARY, 1)
    log.add(ev.SessionSaveRequested, channel="general")
    with psycopg.connect(db) as conn:
        (sid,) = conn.execute("SELECT session_id FROM sessions").fetchone() or ("",)
    erase(log, sender="ann")
    # The job read the messages before the erase and pushed after it (round 0).
    log.add(ev.SummaryGenerated, channel="general", session_id=sid, summary=f"late {CANARY}")
    assert CANARY not in everything(db)
    log.add(ev.SummaryGenerated, channel="general", session_id=sid, summary="fresh", round=1)
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT summary, summary_round FROM sessions").fetchone() == (
            "fresh",
            1,
        )


def test_the_erase_record_holds_hashes_only(log: Log, db: str) -> None:
    exchange(log, "general", "ann-q7", CANARY, 1)
    erase(log, sender="ann-q7")
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT channel, payload FROM events WHERE kind = 'erase.v1'"
        ).fetchall()
    assert len(rows) == SHARDS
    assert all(
        c.startswith(erasure.ERASE_CHANNEL) and "ann-q7" not in json.dumps(p) for c, p in rows
    )
    assert {p["subject"] for _, p in rows} == {erasure.subject_hash("alpha", "sender", "ann-q7")}
    assert {erasure.shard_of("alpha", c, SHARDS) for c, _ in rows} == set(range(SHARDS))
    assert len({uuid.UUID(p["erase_id"]) for _, p in rows}) == 1


def test_the_cli_erases_through_ingest_and_redis_keeps_nothing_of_it(
    stack: Stack,
    rds: redis.Redis,
    db: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    stack.say(f"ann says {CANARY}", sender="ann")
    stack.say(f"noted {CANARY}", role="assistant")
    stack.say(f"bob says {OTHER}", sender="bob")
    last = stack.say(f"noted {OTHER}", role="assistant")
    stack.stored(last)
    stack.api.push(Outcome.ok(f"They discussed {CANARY} and {OTHER}."))
    stack.producer.save(A, C, source="test")
    saved = stack.notice(nt.SESSION_SAVED)
    stack.run_jobs()
    assert CANARY in (stack.notice(nt.SUMMARY_READY).text or "")
    stack.producer.search(A, C, CANARY, source="test", sender="ann")
    stack.notice(nt.SEARCH_RESULTS)
    bad = json.dumps(
        {
            "type": "message.v1",
            "event_id": str(uuid7()),
            "agent": A,
            "channel": C,
            "sender": "ann",
            "occurred_at": "2026-01-01T00:00:00Z",
            "role": "narrator",
            "content": f"dead {CANARY}",
        }
    )
    rds.xadd(keys.stream(keys.shard_of(A, C, 4)), {codec.ENTRY_FIELD: bad.encode()})
    stack.stored(stack.say("after the bad entry"))
    assert rds.xlen(keys.dead_letters(keys.shard_of(A, C, 4))) == 1
    capsys.readouterr()
    assert cli.main(["export", str(saved.session_id), "--agent", A, "--channel", C]) == 0
    exported = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert CANARY in exported.read_text()

    assert cli.main(["erase", A, "--sender", "ann", "--dry-run"]) == 0
    dry = " ".join(capsys.readouterr().out.split())
    assert "events redacted or dropped: 3 (redacted in general)" in dry
    assert "1 dead letters, 2 notifications" in dry and "1 job records" in dry
    assert "export files: 1" in dry and exported.name in dry
    assert CANARY in canary_in_postgres(db)  # a dry run changes nothing

    assert cli.main(["erase", A, "--sender", "ann", "--source", "test", "--wait", "20"]) == 0
    out = capsys.readouterr().out
    assert out.count("erase ") >= 4 and f"export file {exported}: deleted" in out
    assert not exported.exists()
    stack.run_jobs()  # the touched session's summary, written again
    assert CANARY not in canary_in_postgres(db) and OTHER in canary_in_postgres(db)
    assert CANARY not in canary.redis_keys(rds, [CANARY, OTHER])
    assert OTHER in canary.redis_keys(rds, [CANARY, OTHER])
    assert OTHER in json.dumps(stack.valid())
    [session] = stack.reader.sessions(A, C).sessions
    assert session.summary is not None and CANARY not in session.summary


def canary_in_postgres(db: str) -> dict[str, set[str]]:
    return canary.postgres(db, [CANARY, OTHER])


@pytest.mark.parametrize("text", ["", "a", "ünïcödé summary 要約", "x" * 1000, "[erased] [e"])
def test_the_log_and_python_fill_alike(db: str, text: str) -> None:
    with psycopg.connect(db) as conn:
        row = conn.execute("SELECT contextlog_filler(%s)", (text,)).fetchone()
    assert row == (erasure.filler(text),)


def test_entries_deleted_while_pending_are_acknowledged_not_held(rds: redis.Redis) -> None:
    """A scrub deletes the subject's stored entries before ingest acknowledges them; a
    crash there leaves their ids pending: the next reading acknowledges them, so the trim
    is not held back for ever."""
    streams = Streams(rds, "ingest-a")
    streams.ensure_group(0)
    client: Any = rds  # replies are bytes
    ids = [client.xadd(keys.stream(0), {codec.ENTRY_FIELD: b"{}"}).decode() for _ in range(3)]
    assert len(streams.read_new([0], 10, 10)[0]) == 3
    rds.xdel(keys.stream(0), ids[1])
    assert [i for i, _ in streams.read_own_pending(0)] == [ids[0], ids[2]]
    assert rds.xpending(keys.stream(0), keys.INGEST_GROUP)["pending"] == 2
    rds.xdel(keys.stream(0), ids[0])
    assert [i for i, _ in streams.reload_own_pending(0)] == [ids[2]]
    assert rds.xpending(keys.stream(0), keys.INGEST_GROUP)["pending"] == 1
