"""Idle timers on fakeredis with a fake clock: debounce, re-arm, exactly-once saves."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator

import fakeredis
import pytest
from rq import Queue
from rq.job import Job

from contextlog.schema import events as ev
from contextlog.worker.app.clock import FakeClock
from contextlog.worker.tasks import idle
from contextlog.worker.tasks import timers as tm
from contextlog.worker.tasks.idle import IdleState
from contextlog.worker.tasks.timers import Timers

A, C = "alpha", "general"
T0 = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def timers() -> Iterator[Timers]:
    client = fakeredis.FakeRedis()
    yield Timers(client)
    client.close()


class Conversation:
    """The projection as the idle job reads it, moved by hand."""

    def __init__(self, timeout: int = 30) -> None:
        self.state = IdleState(timeout, None, 0, 0, 0, "discord")
        self.pushed: list[list[ev.Event]] = []

    def message(self, at: dt.datetime) -> None:
        s = self.state
        self.state = dataclasses.replace(
            s, last_activity_at=at, last_message_seq=s.last_message_seq + 1
        )

    def push(self, events: list[ev.Event]) -> None:
        self.pushed.append(events)
        seq = self.state.last_message_seq + 2  # the save, then the clear, are logged
        self.state = dataclasses.replace(self.state, last_saved_seq=seq - 1, cleared_seq=seq)


def scheduled(t: Timers) -> list[str]:
    return list(t.queue.scheduled_job_registry.get_job_ids())


def fire(t: Timers, conv: Conversation, clock: FakeClock) -> str:
    timer = t.read(A, C)
    assert timer is not None
    return idle.check(t, A, C, timer.job, lambda: conv.state, conv.push, clock.now())


def test_decide() -> None:
    s = IdleState(30, T0, 5, 2, 3, None)
    assert idle.decide(s, T0 + dt.timedelta(seconds=29)) == idle.WAIT
    assert idle.decide(s, T0 + dt.timedelta(seconds=30)) == idle.SAVE
    assert idle.decide(dataclasses.replace(s, last_saved_seq=5), T0 + dt.timedelta(hours=1)) == (
        idle.NOTHING_NEW
    )
    assert idle.decide(dataclasses.replace(s, idle_timeout=0), T0 + dt.timedelta(days=9)) == (
        idle.DISABLED
    )


def test_messages_arm_one_job_per_idle_period(timers: Timers) -> None:
    clock = FakeClock(T0)
    for i in range(50):  # 50 batches of messages, a second apart
        at = T0 + dt.timedelta(seconds=i)
        assert timers.arm_many([(A, C, at + dt.timedelta(seconds=30))], at) == (1 if i == 0 else 0)
    assert len(scheduled(timers)) == 1  # no job per message
    timer = timers.read(A, C)
    assert timer is not None and timer.due_ms == tm.ms(T0 + dt.timedelta(seconds=79))
    assert clock.slept == []


def test_activity_re_arms_under_a_new_id_then_saves_once(timers: Timers) -> None:
    clock, conv = FakeClock(T0), Conversation(timeout=30)
    conv.message(T0)
    timers.arm_many([(A, C, T0 + dt.timedelta(seconds=30))], T0)
    first = timers.read(A, C)
    clock.advance(20)
    conv.message(clock.now())  # resets the timer: the job will find it at its deadline
    timers.arm_many([(A, C, clock.now() + dt.timedelta(seconds=30))], clock.now())
    clock.advance(10)  # the first deadline
    assert fire(timers, conv, clock) == idle.WAIT
    second = timers.read(A, C)
    assert first is not None and second is not None and second.job != first.job
    assert second.job in scheduled(timers) and conv.pushed == []
    clock.advance(20)  # the second deadline: 30 s after the last message
    assert fire(timers, conv, clock) == idle.SAVE
    [(save, clear)] = conv.pushed
    assert isinstance(save, ev.SessionSaveRequested) and save.auto
    assert save.description == "Auto-saved after 30 s idle"
    assert isinstance(clear, ev.ContextCleared) and save.source == clear.source == "discord"
    assert timers.read(A, C) is None  # disarmed
    # A redelivered or duplicate job finds no timer and does nothing.
    assert idle.check(timers, A, C, second.job, lambda: conv.state, conv.push, clock.now()) == (
        "superseded"
    )
    assert len(conv.pushed) == 1


def test_two_workers_running_the_same_check_push_the_same_ids(timers: Timers) -> None:
    conv = Conversation(timeout=30)
    conv.message(T0)
    later = T0 + dt.timedelta(minutes=1)
    a = idle.auto_save_events(A, C, conv.state, later)
    b = idle.auto_save_events(A, C, conv.state, later + dt.timedelta(seconds=5))
    assert [e.event_id for e in a] == [e.event_id for e in b]  # the log stores them once
    conv.message(later)
    c = idle.auto_save_events(A, C, conv.state, later)
    assert {e.event_id for e in c}.isdisjoint(e.event_id for e in a)  # a new idle period


def test_nothing_new_since_the_last_save_means_no_save(timers: Timers) -> None:
    clock, conv = FakeClock(T0), Conversation(timeout=60)
    conv.message(T0)
    conv.push([])  # a manual save and clear after the message
    conv.pushed.clear()
    timers.arm_many([(A, C, T0 + dt.timedelta(seconds=60))], T0)
    clock.advance(61)
    assert fire(timers, conv, clock) == idle.NOTHING_NEW
    assert conv.pushed == [] and timers.read(A, C) is None


def test_a_message_during_the_check_re_arms(timers: Timers) -> None:
    clock, conv = FakeClock(T0), Conversation(timeout=30)
    conv.message(T0)
    timers.arm_many([(A, C, T0 + dt.timedelta(seconds=30))], T0)
    clock.advance(30)

    def push_then_a_message_arrives(events: list[ev.Event]) -> None:
        conv.push(events)
        timers.arm_many([(A, C, clock.now() + dt.timedelta(seconds=30))], clock.now())

    timer = timers.read(A, C)
    assert timer is not None
    done = idle.check(
        timers, A, C, timer.job, lambda: conv.state, push_then_a_message_arrives, clock.now()
    )
    assert done == idle.SAVE
    fresh = timers.read(A, C)
    assert fresh is not None and fresh.job != timer.job and fresh.job in scheduled(timers)


def test_disabled_timeout_disarms(timers: Timers) -> None:
    clock, conv = FakeClock(T0), Conversation(timeout=0)
    conv.message(T0)
    timers.arm_many([(A, C, T0)], T0)
    assert fire(timers, conv, clock) == idle.DISABLED
    assert conv.pushed == [] and timers.read(A, C) is None


def test_a_dead_job_is_not_live_but_a_scheduled_one_is(timers: Timers) -> None:
    timers.arm_many([(A, C, T0 + dt.timedelta(seconds=30))], T0)
    timer = timers.read(A, C)
    assert timer is not None
    assert timers.live([timer.job, "idle-gone"], T0) == [True, False]
    Queue(tm.IDLE, connection=timers.redis).scheduled_job_registry.remove(timer.job)
    timers.redis.delete(f"rq:job:{timer.job}")  # Redis lost it
    assert timers.live([timer.job], T0) == [False]


def test_a_job_popped_by_a_worker_that_died_before_starting_it_is_dead(timers: Timers) -> None:
    """SIGKILL between RQ's BLPOP and its 'started' mark: the job is in no list and its
    status stays 'queued' for ever. The sweep took it for alive, and the conversation was
    never saved (1 in 300 in the idle SIGKILL test)."""
    timers.arm_many([(A, C, T0)], T0)
    timer = timers.read(A, C)
    assert timer is not None
    queue = Queue(tm.IDLE, connection=timers.redis)
    queue.enqueue_job(Job.fetch(timer.job, connection=timers.redis))  # due: the scheduler moved it
    assert timers.live([timer.job], T0) == [True]
    timers.redis.lrem(queue.key, 0, timer.job)  # popped, then the worker was killed
    assert timers.live([timer.job], T0) == [False]


def test_human_durations() -> None:
    assert [idle.human(s) for s in (1800, 5, 90, 7200)] == ["30 min", "5 s", "90 s", "2 h"]


def test_a_shortened_timeout_arms_an_earlier_job_and_supersedes_the_late_one(
    timers: Timers,
) -> None:
    clock, conv = FakeClock(T0), Conversation(timeout=1800)
    conv.message(T0)
    timers.arm_many([(A, C, T0 + dt.timedelta(minutes=30))], T0)
    late = timers.read(A, C)
    clock.advance(5)
    conv.state = dataclasses.replace(conv.state, idle_timeout=2)  # /context settings idle=2s
    conv.message(clock.now())
    assert timers.arm_many([(A, C, clock.now() + dt.timedelta(seconds=2))], clock.now()) == 1
    early = timers.read(A, C)
    assert late is not None and early is not None and early.job != late.job
    assert len(scheduled(timers)) == 2
    clock.advance(2)
    assert fire(timers, conv, clock) == idle.SAVE  # the early job
    assert idle.check(timers, A, C, late.job, lambda: conv.state, conv.push, clock.now()) == (
        "superseded"
    )
    assert len(conv.pushed) == 1


class Many:
    """Many conversations' projections, as the idle checks read them."""

    def __init__(self, convs: list[tuple[str, str]], at: dt.datetime, timeout: int = 30) -> None:
        self.states = {c: IdleState(timeout, at, 1, 0, 0, "discord") for c in convs}
        self.pushed: list[ev.Event] = []
        self.reads = 0

    def read(self, convs: object) -> dict[tuple[str, str], IdleState]:
        self.reads += 1
        return {c: self.states[c] for c in convs}  # type: ignore[attr-defined]

    def push(self, events: list[ev.Event]) -> None:
        self.pushed += events
        for e in events:
            if isinstance(e, ev.ContextCleared):
                conv = (e.agent, e.channel)
                self.states[conv] = dataclasses.replace(self.states[conv], cleared_seq=3)


def test_a_storm_going_idle_in_one_second_is_one_job_then_parts_the_workers_share(
    timers: Timers,
) -> None:
    """10,000 conversations idle in the same second were 10,000 delayed jobs: RQ's
    scheduler moves 1,000 a pass and the last save came a minute late."""
    convs = [(A, f"c{i}") for i in range(2 * tm.PART + 7)]
    due = T0 + dt.timedelta(seconds=30)
    arms = [(a, c, due + dt.timedelta(milliseconds=1 + i % 900)) for i, (a, c) in enumerate(convs)]
    assert timers.arm_many(arms, T0) == 1  # one bucket: the second after the deadlines
    [bucket_job] = scheduled(timers)
    job = Job.fetch(bucket_job, connection=timers.redis)
    assert job.func_name == "contextlog.worker.tasks.jobs.idle_due"
    assert job.args == (tm.bucket_key(tm.bucket_second(tm.ms(due)) + 1),)

    taken = timers.take(job.args[0], bucket_job)
    assert sorted(taken) == sorted(convs)
    assert timers.take(job.args[0], bucket_job) == []  # a redelivered bucket job: nothing
    parts = timers.hand_out(bucket_job, taken)
    assert len(parts) == 3
    queued = timers.queue.get_job_ids()
    assert queued == parts  # queued at once, for any worker

    many, later = Many(convs, T0), T0 + dt.timedelta(seconds=31)
    outcomes: dict[tuple[str, str], str] = {}
    for part in parts:
        part_convs = [tuple(c) for c in Job.fetch(part, connection=timers.redis).args[0]]
        outcomes |= idle.check_many(timers, part_convs, part, many.read, many.push, later)
    assert set(outcomes.values()) == {idle.SAVE} and len(outcomes) == len(convs)
    assert many.reads == 3  # one Postgres read per part, not per conversation
    saves = [e for e in many.pushed if isinstance(e, ev.SessionSaveRequested)]
    assert sorted((e.agent, e.channel) for e in saves) == sorted(convs)  # each saved once
    assert all(timers.read(a, c) is None for a, c in convs)
    # The bucket's own job, had it run late, holds none of them any more.
    assert set(
        idle.check_many(timers, convs[:3], bucket_job, many.read, many.push, later).values()
    ) == {"superseded"}


def test_a_timer_armed_for_a_second_whose_job_took_its_bucket_gets_a_new_job(
    timers: Timers,
) -> None:
    due = T0 + dt.timedelta(seconds=30)
    timers.arm_many([(A, "early", due)], T0)
    [first] = scheduled(timers)
    bucket = tm.bucket_key(tm.bucket_second(tm.ms(due)))
    assert timers.take(bucket, first) == [(A, "early")]
    assert timers.arm_many([(A, "late", due)], T0) == 1  # not lost in the taken bucket
    late = timers.read(A, "late")
    assert late is not None and late.job != first and late.job in scheduled(timers)


def test_a_message_while_a_part_is_checked_moves_that_conversation_to_a_later_bucket(
    timers: Timers,
) -> None:
    convs = [(A, "quiet"), (A, "talking")]
    due = T0 + dt.timedelta(seconds=30)
    timers.arm_many([(a, c, due) for a, c in convs], T0)
    job = timers.read(A, "quiet")
    assert job is not None
    many, later = Many(convs, T0), T0 + dt.timedelta(seconds=31)
    new_due = later + dt.timedelta(seconds=30)

    def push_then_a_message(events: list[ev.Event]) -> None:
        many.push(events)
        timers.arm_many([(A, "talking", new_due)], later)

    done = idle.check_many(timers, convs, job.job, many.read, push_then_a_message, later)
    assert done == {(A, "quiet"): idle.SAVE, (A, "talking"): idle.SAVE}
    assert timers.read(A, "quiet") is None
    talking = timers.read(A, "talking")
    assert talking is not None and talking.job != job.job and talking.job in scheduled(timers)
    assert talking.bucket == tm.bucket_key(tm.bucket_second(tm.ms(new_due)))


def test_a_job_left_scheduled_long_after_its_time_is_dead(timers: Timers) -> None:
    """A scheduler killed mid-pass can leave a job in the scheduled registry: the sweep
    must re-arm its timers rather than wait for ever."""
    timers.arm_many([(A, C, T0 + dt.timedelta(seconds=30))], T0)
    timer = timers.read(A, C)
    assert timer is not None
    due = T0 + dt.timedelta(seconds=30)  # its bucket's second
    assert timers.live([timer.job], due + dt.timedelta(seconds=tm.STUCK_S - 1)) == [True]
    assert timers.live([timer.job], due + dt.timedelta(seconds=tm.STUCK_S + 1)) == [False]
