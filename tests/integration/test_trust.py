"""Trust no writer (issue 30.1-2): a result only workers emit is taken only with a
worker's signature, its references are checked against the log, and no producer's clock
decides anything."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import redis

from contextlog.producers.ids import uuid7
from contextlog.schema import codec, keys, signing
from contextlog.schema import events as ev
from contextlog.schema import notices as nt
from contextlog.worker.app import bootstrap
from contextlog.worker.ingest import deadletters
from contextlog.worker.tasks.summarize import LocalSummarizer
from tests.support.exports import HELLO, export_file
from tests.support.running import eventually
from tests.support.session_stack import A, C, Stack

HOUR = dt.timedelta(hours=1)


def _xadd(rds: redis.Redis, event: ev.Event, signature: bytes | None = None) -> None:
    """What any process that can write the streams can do: XADD the raw entry."""
    fields = {codec.ENTRY_FIELD: codec.encode(event)}
    if signature is not None:
        fields[signing.SIGNATURE_FIELD] = signature
    rds.xadd(keys.stream(keys.shard_of(event.agent, event.channel, 4)), fields)  # type: ignore[arg-type]


def _forged(rds: redis.Redis) -> list[str]:
    """The details of the dead letters forged."""
    letters = deadletters.newest(rds, 4, 100)
    return [d.fields[b"detail"].decode() for d in letters if d.fields[b"reason"] == b"forged"]


def test_forged_results_are_dead_lettered_and_the_real_summary_wins(
    stack: Stack, rds: redis.Redis
) -> None:
    stack.use(LocalSummarizer())
    for i in range(3):
        stack.say(f"q{i}")
        stack.stored(stack.say(f"a{i}", "assistant"))
    stack.producer.save(A, C, "real work", source="test")
    sid = stack.notice(nt.SESSION_SAVED).session_id
    assert sid is not None
    common: dict[str, Any] = {"agent": A, "channel": C, "occurred_at": dt.datetime.now(dt.UTC)}
    # A compaction that would hide every later message behind an injected summary, and
    # a summary sent right after the save, unsigned and with a made-up signature.
    _xadd(rds, ev.ContextCompacted(event_id=uuid7(), through_seq=10**12, summary="EVIL", **common))
    summary = ev.SummaryGenerated(event_id=uuid7(), session_id=sid, summary="EVIL", **common)
    _xadd(rds, summary, signature=b"0" * 64)
    eventually(lambda: len(_forged(rds)) == 2, what="two forged entries dead-lettered")
    stack.run_jobs()  # the worker's own summary, signed
    ready = stack.notice(nt.SUMMARY_READY)
    assert ready.text is not None and "EVIL" not in ready.text
    stack.stored(stack.say("still here"))
    ctx = stack.reader.context(A, C)
    assert "EVIL" not in str(ctx.messages) + str(ctx.system) and ctx.messages[-1]["content"]
    assert stack.reader.session(sid).summary == ready.text
    assert set(_forged(rds)) == {
        "compaction.v1 is a worker's result, without a worker's signature",
        "summary.v1 is a worker's result, without a worker's signature",
    }


def test_a_signed_result_naming_positions_past_its_own_is_not_applied(stack: Stack) -> None:
    """A worker's key does not make a reference valid: a compaction through a seq the log
    had not reached is refused, never applied."""
    stack.say("q")
    stack.stored(stack.say("a", "assistant"))
    segment = stack.reader.segment(A, C).segment
    assert segment is not None
    compaction = ev.ContextCompacted(
        event_id=uuid7(),
        agent=A,
        channel=C,
        occurred_at=dt.datetime.now(dt.UTC),
        through_seq=10**12,
        summary="made up",
        boundaries=segment.boundaries,
    )
    stack.stored(stack.worker.push(compaction))
    stack.stored(stack.say("next"))
    ctx = stack.reader.context(A, C)
    assert not ctx.compacted and [m["role"] for m in ctx.messages] == ["user", "assistant", "user"]


def test_the_workers_key_is_kept_in_postgres_and_shared(stack: Stack) -> None:
    """Without CONTEXTLOG_SIGNING_KEY, the first process that needs a key makes it, and
    every other reads the same one: ingest takes what the worker signs."""
    one = bootstrap.signing_key(stack.settings).get()
    two = bootstrap.signing_key(stack.settings).get()
    assert one == two and len(one) >= signing.MIN_KEY_BYTES


def test_a_producers_clock_decides_no_window_no_restore_and_no_order(stack: Stack) -> None:
    """Findings 4 and 5: a producer an hour slow with a 30 min window, and sessions saved
    from hosts whose clocks disagree: the time ingest logged each event decides."""
    slow = dt.datetime.now(dt.UTC) - HOUR
    stack.producer.configure(A, C, rolling_window=1800, source="test")
    stack.say("q1", occurred_at=slow)
    last = stack.say("a1", "assistant", occurred_at=slow)
    ctx = stack.reader.context(A, C, wait_for=last, timeout=10)
    assert [m["role"] for m in ctx.messages] == ["user", "assistant"]  # not aged out
    stack.producer.save(A, C, "from the slow host", source="test", occurred_at=slow)
    first = stack.notice(nt.SESSION_SAVED).session_id
    stack.stored(stack.say("q2", occurred_at=slow + 3 * HOUR))  # and one fast host
    stack.producer.save(A, C, "from the fast host", source="test", occurred_at=slow + 3 * HOUR)
    second = stack.notice(nt.SESSION_SAVED).session_id
    listed = [s.session_id for s in stack.reader.sessions(A, C).sessions]
    assert listed == [second, first]  # newest first: the order they were logged in
    stack.producer.clear(A, C, source="test", occurred_at=slow)
    stack.producer.restore(A, C, "last", source="test", occurred_at=slow)
    assert stack.notice(nt.RESTORE_DONE).session_id == second  # "last" agrees with the list
    ctx = stack.reader.context(A, C)
    assert [m["role"] for m in ctx.messages] == ["user", "assistant", "user"]
    stack.producer.purge_sessions(A, C, 1, source="test")
    stack.notice(nt.SESSIONS_PURGED)
    assert [s.session_id for s in stack.reader.sessions(A, C).sessions] == [second]


def test_an_imported_session_is_listed_by_when_it_came_and_its_summary_says_so(
    stack: Stack, tmp_path: Path
) -> None:
    """An export file dated 2099 does not stay first in the list for ever, and its summary
    is not presented as this deployment's worker's."""
    from contextlog.worker.cli import main as cli

    path = export_file(
        tmp_path, HELLO, timestamp="2099-12-31T00:00:00Z", summary="They said hello."
    )
    argv = ["import", str(path), "--agent", A, "--channel", C, "--source", "test"]
    assert cli.main(argv) == 0
    imported = stack.notice(nt.SESSION_IMPORTED).session_id
    info = stack.reader.session(str(imported))
    assert info.imported_from == dt.datetime(2099, 12, 31, tzinfo=dt.UTC)
    assert info.created_at < dt.datetime.now(dt.UTC) + HOUR  # when it came
    stack.stored(stack.say("a new question"))
    stack.producer.save(A, C, "newer", source="test")
    newer = stack.notice(nt.SESSION_SAVED).session_id
    assert [s.session_id for s in stack.reader.sessions(A, C).sessions] == [newer, imported]
    stack.producer.restore(A, C, str(imported), source="test")
    stack.notice(nt.RESTORE_DONE)
    ctx = stack.reader.context(A, C)
    assert ctx.system is not None and ctx.system.startswith(f"Resumed imported session {imported}")
    assert "as the imported file gives it: They said hello." in ctx.system
