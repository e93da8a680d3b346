"""Sessions end to end on real Postgres and Redis: ingest in a thread, RQ jobs in burst
mode, the Anthropic API faked at its HTTP transport."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from rq import Queue
from rq.executions import ExecutionRegistry
from rq.job import JobStatus

from contextlog.producers.ids import uuid7
from contextlog.schema import codec
from contextlog.schema import events as ev
from contextlog.schema import notices as nt
from contextlog.schema.errors import Refused, Unavailable
from contextlog.worker.app import bootstrap
from contextlog.worker.app.clock import FakeClock
from contextlog.worker.cli import main as cli
from contextlog.worker.effects.notify import MemoryNotifier
from contextlog.worker.effects.relay import Relay
from contextlog.worker.store.eventlog import Accepted, PostgresEventLog
from contextlog.worker.store.rebuild import rebuild
from contextlog.worker.tasks.queue import SUMMARIES, Jobs
from contextlog.worker.tasks.summarize import (
    FAILED_TEXT,
    TRUNCATED,
    LocalSummarizer,
)
from tests.support.anthropic_rules import check_messages
from tests.support.fake_anthropic import Outcome
from tests.support.running import eventually
from tests.support.session_stack import A, C, Stack


def texts(messages: list[dict[str, Any]]) -> list[str]:
    return [b.get("text", b.get("type")) for m in messages for b in m["content"]]


def test_save_summary_history_restore_export_import(
    stack: Stack,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The issue's "done when", from an adapter's side."""
    stack.api.push(Outcome.ok("Refactored auth into a token service; the session store is left."))
    stack.say("How should I split the auth module?")
    stack.say("Into a token service and a session store.", "assistant")
    stack.producer.save(A, C, "Auth refactor", source="test", provider="anthropic", model="m1")
    saved = stack.notice(nt.SESSION_SAVED)
    assert saved.session_id == f"{saved.occurred_at:%Y-%m-%d}_auth-refactor"
    assert stack.reader.session(saved.session_id).summary is None  # pending
    assert texts(stack.valid()) == [
        "How should I split the auth module?",
        "Into a token service and a session store.",
    ]  # saving does not clear

    stack.run_jobs()
    ready = stack.notice(nt.SUMMARY_READY)
    assert ready.text == "Refactored auth into a token service; the session store is left."
    assert not ready.local and not ready.failed
    prompt = stack.api.prompts[0]
    assert "How should I split the auth module?" in prompt

    page = stack.reader.sessions(A, C)
    [info] = page.sessions
    assert (info.session_id, info.message_count, info.auto) == (saved.session_id, 2, False)
    assert info.summary == ready.text and info.description == "Auth refactor"
    assert (info.provider, info.model) == ("anthropic", "m1")
    assert info.preview == "How should I split the auth module?"

    stack.producer.clear(A, C, source="test")
    stack.stored(stack.say("something else entirely"))
    stack.producer.restore(A, C, "last", source="test")
    assert stack.notice(nt.RESTORE_DONE).session_id == saved.session_id
    ctx = stack.reader.context(A, C)
    assert texts(ctx.messages) == [
        "How should I split the auth module?",
        "Into a token service and a session store.",
    ]
    assert ctx.system is not None and saved.session_id in ctx.system and ready.text in ctx.system
    assert check_messages(ctx.messages) == []

    monkeypatch.chdir(tmp_path)
    assert cli.main(["export", saved.session_id, "--agent", A, "--channel", C]) == 0
    exported = tmp_path / f"{saved.session_id}.json"
    doc = json.loads(exported.read_text())
    assert doc["session_id"] == saved.session_id and doc["message_count"] == 2
    assert doc["summary"] == ready.text
    assert doc["messages"][0]["content"] == "How should I split the auth module?"
    assert {"timestamp", "token_estimate", "window_start", "window_end"} <= doc.keys()

    assert (
        cli.main(["import", str(exported), "--agent", A, "--channel", "dm", "--source", "test"])
        == 0
    )
    imported = stack.notice(nt.SESSION_IMPORTED)
    assert imported.channel == "dm" and imported.session_id == saved.session_id
    assert stack.reader.session(saved.session_id, agent=A, channel="dm").summary == ready.text
    assert stack.valid("dm") == []  # imported messages are not in the live window
    stack.producer.restore(A, "dm", saved.session_id, source="test")
    stack.notice(nt.RESTORE_DONE)
    assert texts(stack.valid("dm"))[0] == "How should I split the auth module?"


@pytest.mark.parametrize(
    ("script", "expected", "failed"),
    [
        ([Outcome.ok("It worked.")], "It worked.", False),
        ([Outcome.error(429, retry_after=2), Outcome.ok("After a 429.")], "After a 429.", False),
        ([Outcome.error(500)] * 4, FAILED_TEXT, True),
        ([Outcome.timeout(), Outcome.ok("After a timeout.")], "After a timeout.", False),
        ([Outcome.timeout()] * 4, FAILED_TEXT, True),
        ([Outcome.invalid_json()] * 4, FAILED_TEXT, True),
        ([Outcome.no_content(), Outcome.ok("After a bad body.")], "After a bad body.", False),
    ],
    ids=[
        "ok",
        "429-then-ok",
        "500-always",
        "timeout-then-ok",
        "timeout-always",
        "bad-json",
        "no-content-then-ok",
    ],
)
def test_summary_outcomes_land_as_events(
    stack: Stack, script: list[Outcome], expected: str, failed: bool
) -> None:
    stack.api.push(*script)
    stack.say("Deploy the billing service.")
    stack.say("Deployed; migrations ran.", "assistant")
    stack.producer.save(A, C, "deploy", source="test")
    sid = stack.notice(nt.SESSION_SAVED).session_id
    stack.run_jobs()
    ready = stack.notice(nt.SUMMARY_READY)
    assert (ready.text, ready.failed) == (expected, failed)
    info = stack.reader.session(sid or "")
    assert info.summary == expected and info.summary_failed is failed
    assert info.message_count == 2  # a failed summary leaves the session intact
    assert len(stack.api.requests) == len(script)  # retried until success or the last try
    assert len(stack.delays) == len(script) - 1  # backed off between tries, on the fake clock


def test_without_an_api_key_the_local_summarizer_marks_its_summary(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stack.use(LocalSummarizer())
    stack.say("Plan the offsite.")
    stack.producer.save(A, C, source="test")
    saved = stack.notice(nt.SESSION_SAVED)
    stack.run_jobs()
    ready = stack.notice(nt.SUMMARY_READY)
    assert ready.local and "Plan the offsite." in (ready.text or "")
    sid = saved.session_id or ""
    assert stack.reader.session(sid).summary_local
    assert stack.api.requests == []
    # Exported and imported elsewhere, it is still marked as the local summarizer's.
    out = tmp_path / "s.json"
    assert cli.main(["export", sid, "--agent", A, "--channel", C, "-o", str(out)]) == 0
    assert json.loads(out.read_text())["summary_local"] is True
    imported = ["import", str(out), "--agent", A, "--channel", "dm", "--source", "test"]
    assert cli.main([*imported, "--wait", "0"]) == 0
    stack.notice(nt.SESSION_IMPORTED)
    copy = stack.reader.session(sid, agent=A, channel="dm")
    assert (copy.summary, copy.summary_local) == (ready.text, True)
    capsys.readouterr()


def test_refusals_are_notified_and_change_nothing(stack: Stack) -> None:
    stack.producer.save(A, C, "nothing yet", source="test")
    assert "empty" in (stack.notice(nt.COMMAND_REFUSED).text or "")
    assert stack.reader.sessions(A).total == 0

    stack.say("other conversation's work", channel="other")
    stack.producer.save(A, "other", "theirs", source="test")
    theirs = stack.notice(nt.SESSION_SAVED).session_id or ""
    stack.stored(stack.say("mine"))
    for send in (stack.producer.restore, stack.producer.delete_session):
        send(A, C, theirs, source="test")
        # as for an id that does not exist: the refusal tells nothing of other conversations
        assert stack.notice(nt.COMMAND_REFUSED).text == f"there is no session {theirs!r}"
    assert texts(stack.valid()) == ["mine"]
    assert stack.reader.session(theirs).channel == "other"  # not deleted
    with pytest.raises(Refused, match=f"^there is no session {theirs!r}$"):
        stack.reader.session_messages(theirs, agent=A, channel=C)
    assert cli.main(["export", theirs, "--agent", A, "--channel", C]) == 2
    stack.producer.restore(A, C, "no-such-session", source="test")
    assert "no session" in (stack.notice(nt.COMMAND_REFUSED).text or "")


def test_ids_collide_into_suffixes_and_hash_without_description(stack: Stack) -> None:
    stack.say("Which database should we use?")
    for _ in range(3):
        stack.producer.save(A, C, "Same Name", source="test")
    stack.producer.save(A, C, source="test")
    ids = [stack.notice(nt.SESSION_SAVED).session_id for _ in range(4)]
    day = ids[0][:10] if ids[0] else ""
    digest = hashlib.sha256(b"Which database should we use?").hexdigest()[:6]
    assert ids == [
        f"{day}_same-name",
        f"{day}_same-name-2",
        f"{day}_same-name-3",
        f"{day}_{digest}",
    ]


def test_a_save_covers_every_thread_and_delete_purge_hide_but_keep_the_log(
    stack: Stack, db: str
) -> None:
    stack.say("main line question")
    stack.say("thread question", thread="t1")
    stack.say("thread answer", "assistant", thread="t1")
    for i in range(4):
        stack.producer.save(A, C, f"s{i}", source="test")
    ids = [stack.notice(nt.SESSION_SAVED).session_id or "" for _ in range(4)]
    assert stack.reader.session(ids[0]).message_count == 3
    stack.producer.delete_session(A, C, ids[1], source="test")
    stack.notice(nt.SESSION_DELETED)
    assert [s.session_id for s in stack.reader.sessions(A, C)] == [ids[3], ids[2], ids[0]]
    with pytest.raises(Refused, match="no session"):
        stack.reader.session(ids[1])
    stack.producer.restore(A, C, ids[1], source="test")
    assert "deleted" in (stack.notice(nt.COMMAND_REFUSED).text or "")
    stack.producer.purge_sessions(A, C, 1, source="test")
    assert stack.notice(nt.SESSIONS_PURGED).text == "deleted 2 sessions, kept the newest 1"
    assert [s.session_id for s in stack.reader.sessions(A, C)] == [ids[3]]
    with psycopg.connect(db) as conn:  # the log keeps every message and command
        kinds = [r[0] for r in conn.execute("SELECT kind FROM events ORDER BY position")]
    assert kinds.count("save.v1") == 4 and kinds.count("message.v1") == 3

    # Restoring a multi-thread session brings each thread's messages back to it.
    stack.producer.clear(A, C, source="test")
    stack.producer.restore(A, C, ids[3], source="test")
    stack.notice(nt.RESTORE_DONE)
    assert texts(stack.reader.context(A, C, "t1").messages) == ["thread question", "thread answer"]


def test_history_pages_ten_at_a_time_newest_first(stack: Stack) -> None:
    stack.say("hello")
    with stack.producer.batch() as b:
        for i in range(23):
            b.save(A, C, f"n{i:02d}", source="test")
    for _ in range(23):
        stack.notice(nt.SESSION_SAVED)
    pages = [stack.reader.sessions(A, C, page=p) for p in (1, 2, 3)]
    assert [len(p) for p in pages] == [10, 10, 3] and pages[0].pages == 3
    names = [s.description for p in pages for s in p]
    assert names == [f"n{i:02d}" for i in reversed(range(23))]
    assert all(s.pending for p in pages for s in p)


def test_rebuild_reproduces_sessions_and_restores(stack: Stack, db: str) -> None:
    stack.say("first")
    stack.producer.save(A, C, "one", source="test")
    stack.notice(nt.SESSION_SAVED)
    stack.run_jobs()
    stack.notice(nt.SUMMARY_READY)
    stack.producer.restore(A, C, "last", source="test")
    stack.notice(nt.RESTORE_DONE)
    stack.producer.delete_session(A, C, "last", source="test")
    stack.notice(nt.SESSION_DELETED)
    snapshot = "SELECT * FROM sessions ORDER BY agent, channel, session_id"
    conv = "SELECT * FROM conversations ORDER BY agent, channel"
    with psycopg.connect(db) as conn:
        before = (conn.execute(snapshot).fetchall(), conn.execute(conv).fetchall())
        rebuild(conn)
        after = (conn.execute(snapshot).fetchall(), conn.execute(conv).fetchall())
        effects = conn.execute("SELECT count(*) FROM effects").fetchone()
    assert after == before
    assert effects == (0,)  # nothing resent by the replay


class Exploding:
    """A summarizer whose process dies mid-job, as far as RQ can tell."""

    def summarize(self, messages: Any, *, previous: str | None = None, purpose: str = "") -> Any:
        raise RuntimeError("worker lost")


def test_lost_and_failed_summary_jobs_are_queued_again(stack: Stack, rds: redis.Redis) -> None:
    stack.use(LocalSummarizer())
    jobs = Jobs(rds)
    now = dt.datetime.now(dt.UTC)
    stack.say("first")
    stack.producer.save(A, C, "lost", source="test")
    stack.notice(nt.SESSION_SAVED)
    queue = Queue(SUMMARIES, connection=rds)
    eventually(lambda: queue.count == 1, what="the summary job")  # queued after the notice
    queue.empty()  # type: ignore[no-untyped-call]  # job lost
    assert jobs.requeue_pending(stack.reader, now, grace=120) == 0  # still in its grace time
    assert jobs.requeue_pending(stack.reader, now + dt.timedelta(minutes=3), grace=120) == 1
    stack.use(Exploding())
    stack.run_jobs()  # the job fails; the session stays pending
    assert stack.reader.session(stack.reader.sessions(A).sessions[0].session_id).pending
    stack.use(LocalSummarizer())
    assert jobs.requeue_pending(stack.reader, now + dt.timedelta(minutes=3), grace=120) == 1
    assert jobs.requeue_pending(stack.reader, now + dt.timedelta(minutes=3), grace=120) == 0
    stack.run_jobs()
    assert stack.notice(nt.SUMMARY_READY).local


def test_a_summary_job_popped_by_a_worker_killed_before_starting_it_is_queued_again(
    stack: Stack, rds: redis.Redis
) -> None:
    """Killed between RQ's pop and its start mark, a worker leaves the job in no queue
    with its status 'queued' for good: the sweep took it for alive, and the summary never
    landed."""
    stack.use(LocalSummarizer())
    jobs = Jobs(rds)
    stack.say("first")
    stack.producer.save(A, C, "popped", source="test")
    stack.notice(nt.SESSION_SAVED)
    queue = Queue(SUMMARIES, connection=rds)
    eventually(lambda: queue.count == 1, what="the summary job")
    [job_id] = queue.get_job_ids()
    rds.lrem(queue.key, 0, job_id)  # popped, then the worker was SIGKILLed
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=3)
    assert jobs.requeue_pending(stack.reader, later, grace=120) == 1
    assert queue.get_job_ids() == [job_id]
    stack.run_jobs()
    assert stack.notice(nt.SUMMARY_READY).local


class DownNotifier:
    def publish(self, notices: Any) -> None:
        raise Unavailable("redis is down")


@dataclass
class RecordingJobs:
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def summarize(self, agent: str, channel: str, session_id: str, round: int = 0) -> bool:
        self.calls.append(("summarize", agent, channel, session_id))
        return True

    def compact_many(self, convs: list[tuple[str, str]]) -> int:
        self.calls += [("compact", a, c) for a, c in convs]
        return len(convs)


def test_effects_survive_an_outage_between_commit_and_relay(db: str) -> None:
    jobs = RecordingJobs()
    down = PostgresEventLog(psycopg.connect(db), relay=Relay(DownNotifier(), jobs))  # type: ignore[arg-type]
    at = dt.datetime.now(dt.UTC)
    common: dict[str, Any] = {"agent": A, "channel": C, "occurred_at": at, "source": "bot"}
    batch: list[ev.AnyEvent] = [
        ev.MessagePosted(event_id=uuid7(), role="user", content="hi", **common),
        ev.SessionSaveRequested(event_id=uuid7(), description="x", **common),
    ]
    accepted = [Accepted(f"{i}-0", e, codec.encode(e)) for i, e in enumerate(batch, 1)]
    assert down.append(0, 1, accepted) == 2  # committed, though the relay failed
    notifier = MemoryNotifier()
    up = PostgresEventLog(psycopg.connect(db), relay=Relay(notifier, jobs))  # type: ignore[arg-type]
    assert up.flush_effects(older_than=60) == 0  # a batch's own relay may still be at it
    assert up.flush_effects(older_than=0) == 2
    assert [n.kind for n in notifier.of("bot")] == [nt.SESSION_SAVED]
    # The job went before the notifier failed and again with the resend: RQ's job id
    # (summarize-<session>) keeps it one job.
    assert set(jobs.calls) == {("summarize", A, C, f"{at:%Y-%m-%d}_x")}
    assert up.flush_effects(older_than=0) == 0  # sent once
    down.close()
    up.close()


def test_status_reports_the_summary_backlog_and_queues_without_workers(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    stack.say("hello")
    stack.producer.save(A, C, "x", source="test")
    stack.notice(nt.SESSION_SAVED)
    eventually(lambda: Queue(SUMMARIES, connection=stack.rds).count == 1, what="the job")
    capsys.readouterr()
    assert cli.main(["status", "--json"]) == 1  # a job waits and no worker runs
    report = json.loads(capsys.readouterr().out)
    summaries = next(q for q in report["queues"] if q["name"] == "summaries")
    assert summaries["queued"] == 1 and report["summary_backlog"] == 1
    assert report["oldest_pending_summary_age_s"] >= 0
    assert "queue summaries has jobs and no worker is running" in report["problems"]
    stack.run_jobs()
    stack.notice(nt.SUMMARY_READY)
    assert cli.main(["status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["summary_backlog"] == 0 and report["healthy"]


def test_the_same_session_id_in_many_conversations_each_gets_its_summary(stack: Stack) -> None:
    stack.use(LocalSummarizer())
    channels = [f"c{i:02d}" for i in range(60)]  # more than one lookup page of 50
    with stack.producer.batch() as b:
        for ch in channels:
            b.post_message(A, ch, "user", f"work in {ch}", source="test")
            b.save(A, ch, "Same name", source="test")
    for _ in channels:
        stack.notice(nt.SESSION_SAVED)
    stack.run_jobs()
    sid = stack.reader.sessions(A, "c59").sessions[0].session_id

    def summarised(ch: str) -> bool:
        return stack.reader.session(sid, agent=A, channel=ch).summary is not None

    eventually(lambda: all(summarised(ch) for ch in channels), what="60 summaries")
    for ch in channels:
        info, messages = stack.reader.session_messages(sid, agent=A, channel=ch)
        assert info.channel == ch and messages[0].content == f"work in {ch}"


def test_a_summary_lost_with_its_worker_is_queued_again_by_the_sweeper(
    stack: Stack, rds: redis.Redis
) -> None:
    """Issue 10 item 5: a worker SIGKILLed mid-summary leaves a failed job whose execution
    expired before its index; deleting it raised "Execution ... not found", which ended the
    sweeper thread for the life of the process."""
    stack.use(LocalSummarizer())
    stack.say("first")
    stack.producer.save(A, C, "lost", source="test")
    stack.notice(nt.SESSION_SAVED)
    queue = Queue(SUMMARIES, connection=rds)
    eventually(lambda: queue.count == 1, what="the summary job")
    [job] = queue.get_jobs()
    queue.remove(job)
    job.set_status(JobStatus.FAILED)  # as StartedJobRegistry.cleanup leaves it
    rds.zadd(ExecutionRegistry(job.id, rds).key, {"expired": time.time() + 600})
    later = FakeClock(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=3))
    res = bootstrap.resources()
    bootstrap.install(dataclasses.replace(res, clock=later))
    stop = threading.Event()
    stop.set()  # one cycle, then the loop ends
    bootstrap.sweep_forever(stack.settings, stop)
    assert queue.count == 1  # queued again
    stack.run_jobs()
    assert stack.notice(nt.SUMMARY_READY).local


@pytest.mark.parametrize(
    ("answer", "stored", "failed"),
    [
        ("Fixed the \x00login bug.", "Fixed the login bug.", False),
        ("y" * (ev.MAX_TEXT + 1), "y" * (ev.MAX_TEXT - len(TRUNCATED)) + TRUNCATED, False),
        ("€" * ev.MAX_TEXT, FAILED_TEXT, True),  # 600 kB: over the entry cap even when cut
    ],
    ids=["nul", "too-long", "too-many-bytes"],
)
def test_answers_the_contract_refuses_still_settle_the_session(
    stack: Stack, rds: redis.Redis, answer: str, stored: str, failed: bool
) -> None:
    """Issue 10 item 7: such an answer made the job raise EventRejected; the sweep queued
    it again every cycle, calling the API each time, and the session never settled."""
    stack.api.push(Outcome.ok(answer))
    stack.say("Deploy the billing service.")
    stack.producer.save(A, C, "deploy", source="test")
    sid = stack.notice(nt.SESSION_SAVED).session_id or ""
    stack.run_jobs()
    ready = stack.notice(nt.SUMMARY_READY)
    assert ready.failed is failed
    info = stack.reader.session(sid)
    assert info.summary == stored and info.summary_failed is failed and not info.pending
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=3)
    assert Jobs(rds).requeue_pending(stack.reader, later, grace=120) == 0  # settled
    assert len(stack.api.requests) == 1
