"""Idle-timeout auto-save with real Redis, a real `contextlog worker` (RQ and its
scheduler) and a 2-second timeout; ingest runs in a thread."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from rq import Queue
from rq.job import Job, JobStatus

from contextlog.producers import ContextReader, Producer
from contextlog.producers.notifications import Notifications
from contextlog.schema import events as ev
from contextlog.schema import notices as nt
from contextlog.schema.notices import Notice
from contextlog.worker.app import bootstrap
from contextlog.worker.tasks import idle
from contextlog.worker.tasks import timers as tm
from contextlog.worker.tasks.timers import Timers, timer_key
from tests.support.processes import Process, offline_env, started
from tests.support.running import eventually, running, settings_for

A = "alpha"


@pytest.fixture
def env(db: str, redis_url: str) -> dict[str, str]:
    return offline_env(db, redis_url, CONTEXTLOG_SWEEP_SECONDS="1", CONTEXTLOG_LOG_FORMAT="console")


@pytest.fixture
def worker(env: dict[str, str], tmp_path: Path, db: str, redis_url: str) -> Iterator[Process]:
    with running(settings_for(db, redis_url)), started("worker", env, tmp_path / "w.log") as w:
        yield w


def sessions(db: str, channel: str) -> list[tuple[str, bool, int, str | None]]:
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "SELECT session_id, auto, message_count, summary FROM sessions"
            " WHERE agent = %s AND channel = %s ORDER BY seq",
            (A, channel),
        ).fetchall()
    return [(str(r[0]), bool(r[1]), int(r[2]), r[3]) for r in rows]


def collect(notes: Notifications, seen: list[Notice]) -> list[Notice]:
    got = notes.read(block_ms=100)
    notes.ack(got)
    seen.extend(got)
    return seen


def test_a_quiet_conversation_is_saved_once_summarised_notified_and_cleared(
    worker: Process, db: str, redis_url: str
) -> None:
    producer = Producer(redis.Redis.from_url(redis_url), shards=4)
    reader = ContextReader.from_url(db)
    notes = Notifications(redis.Redis.from_url(redis_url), "bot", consumer="t")
    seen: list[Notice] = []
    try:
        producer.configure(A, "quiet", idle_timeout=2, source="bot")
        producer.configure(A, "never", idle_timeout=0, source="bot")
        producer.post_message(A, "never", "user", "no timer here", source="bot")
        # Two messages 1.5 s apart: the second, before the first's deadline, resets it.
        earlier = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1.5)
        producer.post_message(
            A, "quiet", "user", "Remind me to renew the cert.", source="bot", occurred_at=earlier
        )
        last = producer.post_message(
            A, "quiet", "assistant", "Noted: renew it by Friday.", source="bot"
        )
        reader.context(A, "quiet", wait_for=last, timeout=10)
        sent_at = time.time()

        def summary_arrived() -> bool:
            return any(n.kind == nt.SUMMARY_READY for n in collect(notes, seen))

        eventually(summary_arrived, timeout=30, what=f"an auto-save summary\n{worker.tail()}")
        saved = next(n for n in seen if n.kind == nt.SESSION_SAVED)
        ready = next(n for n in seen if n.kind == nt.SUMMARY_READY)
        assert saved.auto and ready.auto and ready.local  # no API key: the local summarizer
        assert "Remind me to renew the cert." in (ready.text or "")
        assert saved.occurred_at.timestamp() >= sent_at + 2 - 0.5  # 2 s after the last message
        [(sid, auto, count, summary)] = sessions(db, "quiet")
        assert auto and count == 2 and summary == ready.text and sid == saved.session_id
        assert reader.context(A, "quiet").messages == []  # cleared after the save

        # The timer is gone and nothing is scheduled: no second save can come.
        rds = redis.Redis.from_url(redis_url)
        idle_queue = Queue("idle", connection=rds)
        eventually(
            lambda: (
                rds.exists(timer_key(A, "quiet")) == 0
                and idle_queue.scheduled_job_registry.count == 0
            ),
            what="the timer to be disarmed",
        )
        rds.close()
        assert len(sessions(db, "quiet")) == 1
        assert sessions(db, "never") == []
        assert reader.context(A, "never").messages != []
    finally:
        producer.close()
        reader.close()
        notes.close()


class Crash(BaseException):
    """The worker dies here (SIGKILL leaves no chance to clean up either)."""


@pytest.mark.parametrize("dies", ["before the push", "after the push"])
def test_a_check_that_dies_mid_save_is_redone_by_the_sweep_and_saves_once(
    db: str, redis_url: str, dies: str
) -> None:
    """The SIGKILL of the issue, at the exact moments that matter: the check is run by
    hand, `Crash` stands for the kill, the sweep (as the restarted worker runs it) finds
    the timer's job dead and re-arms it, and the re-run saves once."""
    rds = redis.Redis.from_url(redis_url)
    timers = Timers(rds)
    settings = settings_for(db, redis_url)
    producer = Producer(rds, shards=4, signing_key=bootstrap.signing_key(settings))  # a worker
    reader = ContextReader.from_url(db)
    try:
        with running(settings):
            producer.configure(A, "c", idle_timeout=2, source="bot")
            last = producer.post_message(A, "c", "user", "write the report", source="bot")
            reader.context(A, "c", wait_for=last, timeout=10)
            eventually(lambda: timers.read(A, "c") is not None, what="the timer")
            timer = timers.read(A, "c")
            assert timer is not None
            now = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3)  # past the deadline

            def push_and_die(events: list[ev.Event]) -> None:
                if dies == "after the push":
                    producer.push_many(events, atomic=True)
                raise Crash

            # What a worker leaves in RQ when it is killed running the job.
            job = Job.fetch(timer.job, connection=rds)
            job.started_at = now.replace(tzinfo=None)
            job.set_status(JobStatus.STARTED)
            job.save()
            with pytest.raises(Crash):
                idle.check(
                    timers,
                    A,
                    "c",
                    timer.job,
                    lambda: idle.read_states(reader, [(A, "c")]).get((A, "c")),
                    push_and_die,
                    now,
                )
            # The restarted worker's sweep: the job is no longer alive, so a new one is armed.
            idle.sweep(reader, timers, now + dt.timedelta(seconds=tm.STUCK_S + 1))
            again = timers.read(A, "c")
            assert again is not None and again.job != timer.job
            for _ in range(2):  # and a redelivery of the new job does nothing more
                idle.check(
                    timers,
                    A,
                    "c",
                    again.job,
                    lambda: idle.read_states(reader, [(A, "c")]).get((A, "c")),
                    lambda events: producer.push_many(events, atomic=True),
                    now + dt.timedelta(seconds=20),
                )
            eventually(lambda: len(sessions(db, "c")) == 1, what="the auto-save")
            eventually(lambda: reader.context(A, "c").messages == [], what="the clear")
            assert timers.read(A, "c") is None
        with psycopg.connect(db) as conn:
            row = conn.execute("SELECT count(*) FROM events WHERE kind = 'save.v1'").fetchone()
        assert row == (1,)
    finally:
        reader.close()
        rds.close()


def test_a_shorter_idle_setting_arms_the_timer_at_once(db: str, redis_url: str) -> None:
    """`/context settings idle=5s` used to change nothing until the next message."""
    producer = Producer(redis.Redis.from_url(redis_url), shards=4)
    reader = ContextReader.from_url(db)
    rds = redis.Redis.from_url(redis_url)
    timers = Timers(rds)
    try:
        with running(settings_for(db, redis_url)):
            # The producer's clock is 30 s behind: the deadline follows the time ingest
            # logged the message, not this stamp.
            stamp = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(seconds=30)
            eid = producer.post_message(A, "settings", "user", "hi", occurred_at=stamp)
            reader.context(A, "settings", wait_for=eid, timeout=10)
            with psycopg.connect(db) as conn:
                row = conn.execute(
                    "SELECT last_activity_at FROM conversations WHERE channel = 'settings'"
                ).fetchone()
            assert row is not None and row[0] > stamp + dt.timedelta(seconds=20)
            at = row[0]
            first = timers.read(A, "settings")
            assert first is not None and first.due_ms == tm.ms(at + dt.timedelta(minutes=30))
            eid = producer.configure(A, "settings", idle_timeout=5)  # no message after it
            reader.context(A, "settings", wait_for=eid, timeout=10)

            due = tm.ms(at + dt.timedelta(seconds=5))
            scheduled = Queue("idle", connection=rds).scheduled_job_registry

            def rearmed() -> bool:
                timer = timers.read(A, "settings")
                jobs = scheduled.get_job_ids()
                return (
                    timer is not None
                    and f"-{tm.bucket_second(due)}-" in timer.job
                    and timer.job in jobs
                )

            eventually(rearmed, what="a job armed for the new 5 s timeout")
    finally:
        producer.close()
        reader.close()
        rds.close()
