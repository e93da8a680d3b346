"""Idle-timeout auto-save: the decision, the checks the idle jobs run, and the sweep.

A batch of messages costs one Redis command per conversation (timers.py's `arm`
script): it records the newest deadline and, when no timer is armed, puts the
conversation into the bucket of its deadline's second, whose one delayed job checks
every conversation due then. A check reads the conversations in Postgres, all at once:
activity since means a new deadline and a new bucket; silence with messages newer than
the last save or clear means an auto-save and a clear, pushed with ids derived from the
last message, so two workers, a redelivered job or a rerun after SIGKILL store them
once. Timers live in Redis; `sweep` re-arms from the Postgres projection whatever Redis
lost, and whatever a dead job held.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import structlog

from contextlog.producers.ids import derived_id
from contextlog.schema import events as ev
from contextlog.schema.queries import query
from contextlog.worker.app import metrics
from contextlog.worker.tasks.timers import PART, Conversation, Timers

if TYPE_CHECKING:
    from contextlog.producers.reader import ContextReader
    from contextlog.worker.tasks.resources import Resources

log = structlog.get_logger("contextlog.idle")

JOB_SOURCE: Final = "contextlog-idle"  # namespace of the derived auto-save event ids


def human(seconds: int) -> str:
    """`30 min`, `90 s`, `2 h`: how long a conversation was idle."""
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


# -- the decision, pure --------------------------------------------------------------


@dataclass(frozen=True)
class IdleState:
    """What the idle job reads of a conversation."""

    idle_timeout: int  # effective (the conversation's or the default); 0 disables
    last_activity_at: dt.datetime | None
    last_message_seq: int
    cleared_seq: int
    last_saved_seq: int
    source: str | None

    @property
    def unsaved(self) -> bool:
        """Messages arrived since the last save or clear."""
        return self.last_message_seq > max(self.cleared_seq, self.last_saved_seq)

    def deadline(self) -> dt.datetime | None:
        """When the conversation goes idle (None: never)."""
        if not self.idle_timeout or self.last_activity_at is None:
            return None
        return self.last_activity_at + dt.timedelta(seconds=self.idle_timeout)


DISABLED, WAIT, NOTHING_NEW, SAVE = "disabled", "wait", "nothing new", "save"


def decide(state: IdleState, now: dt.datetime) -> str:
    """What an idle check does at `now`."""
    due = state.deadline()
    if due is None:
        return DISABLED
    if now < due:
        return WAIT
    return SAVE if state.unsaved else NOTHING_NEW


def auto_save_events(agent: str, channel: str, s: IdleState, now: dt.datetime) -> list[ev.Event]:
    """The save and the clear of one idle period; ids derived from its last message."""
    period = f"{agent}\x00{channel}\x00{s.last_message_seq}"
    common: dict[str, Any] = {"agent": agent, "channel": channel, "source": s.source}
    return [
        ev.SessionSaveRequested(
            event_id=derived_id(JOB_SOURCE, f"save\x00{period}"),
            occurred_at=now,
            description=f"Auto-saved after {human(s.idle_timeout)} idle",
            auto=True,
            **common,
        ),
        ev.ContextCleared(
            event_id=derived_id(JOB_SOURCE, f"clear\x00{period}"),
            occurred_at=now + dt.timedelta(microseconds=1),
            **common,
        ),
    ]


# -- the job and the sweep -----------------------------------------------------------


# -- the checks and the sweep ----------------------------------------------------------

States = Callable[[Sequence[Conversation]], Mapping[Conversation, IdleState]]
SUPERSEDED: Final = "superseded"


def read_states(
    reader: ContextReader, convs: Sequence[Conversation]
) -> dict[Conversation, IdleState]:
    """The conversations' idle inputs from the projection, in one query."""
    params = {
        "agents": [a for a, _ in convs],
        "channels": [c for _, c in convs],
        "default": reader.defaults.idle_timeout,
    }
    with reader.connection() as conn:
        rows = conn.execute(query("idle_states"), params).fetchall()
    return {
        (agent, channel): IdleState(timeout, activity, message_seq, cleared_seq, saved_seq, source)
        for agent, channel, timeout, activity, message_seq, cleared_seq, saved_seq, source in rows
    }


def check_many(
    timers: Timers,
    convs: Sequence[Conversation],
    job_id: str,
    states: States,
    push: Callable[[list[ev.Event]], object],
    now: dt.datetime,
) -> dict[Conversation, str]:
    """What job `job_id` does with the timers it holds: re-arm, nothing, or auto-save
    and clear; per conversation, what it did. A few round trips whatever the count:
    the timers, the states, one push of every save, the disarms, the re-arms."""
    held = timers.read_many(convs)
    mine = [c for c in convs if (t := held[c]) is not None and t.job == job_id]
    done = {c: SUPERSEDED for c in convs}  # the sweep re-armed it, or it was handled
    found = states(mine) if mine else {}
    events: list[ev.Event] = []
    later: list[tuple[str, str, dt.datetime]] = []
    finished: list[tuple[Conversation, int]] = []
    for conv in mine:
        s = found.get(conv)
        what = DISABLED if s is None else decide(s, now)
        done[conv] = what
        metrics.IDLE_CHECKS.labels(what).inc()
        due = s.deadline() if s is not None else None
        if what == WAIT and due is not None:
            later.append((*conv, due))
            continue
        if what == SAVE and s is not None and due is not None:
            events += auto_save_events(*conv, s, now)
            metrics.IDLE_DELAY.observe(max(0.0, (now - due).total_seconds()))
        timer = held[conv]
        assert timer is not None
        finished.append((conv, timer.due_ms))
    if events:
        push(events)
        saved = [c for c in mine if done[c] == SAVE]
        log.info("auto-saved after idle", conversations=len(saved), first=list(saved[0]))
    # A message that came while we worked moved the deadline: it is the next check.
    outs = timers.disarm_many(job_id, finished)
    moved = [c for (c, _), out in zip(finished, outs, strict=True) if out == -1]
    for conv, timer in timers.read_many(moved).items():
        if timer is not None:
            later.append((*conv, max(timer.due, now)))
    timers.rearm_many(job_id, later, now)
    return done


def check(
    timers: Timers,
    agent: str,
    channel: str,
    job_id: str,
    state: Callable[[], IdleState | None],
    push: Callable[[list[ev.Event]], object],
    now: dt.datetime,
) -> str:
    """`check_many` for one conversation."""

    def one(convs: Sequence[Conversation]) -> dict[Conversation, IdleState]:
        s = state()
        return {} if s is None else {(agent, channel): s}

    return check_many(timers, [(agent, channel)], job_id, one, push, now)[(agent, channel)]


def run_checks(
    res: Resources, convs: Sequence[Conversation], job_id: str
) -> dict[Conversation, str]:
    """`check_many` with the worker's resources: Postgres states, the producer, the clock."""
    return check_many(
        res.timers,
        convs,
        job_id,
        lambda some: read_states(res.reader, some),
        lambda events: res.producer.push_many(events, atomic=True),
        res.clock.now(),
    )


def run_bucket(res: Resources, bucket: str, job_id: str) -> str:
    """A bucket's job: check its conversations here when they are few, else hand them
    out in parts to jobs the workers share."""
    convs = res.timers.take(bucket, job_id)
    if len(convs) <= PART:
        done = run_checks(res, convs, job_id)
        return f"checked {len(done)}"
    parts = res.timers.hand_out(job_id, convs)
    return f"{len(convs)} conversations handed out to {len(parts)} jobs"


def sweep(reader: ContextReader, timers: Timers, now: dt.datetime) -> int:
    """Reconcile the timers with the projection: every conversation with unsaved messages
    and an idle timeout gets a live timer (Redis lost it, or its job died), and a timer
    whose job died after its save is dropped. Returns how many timers were armed."""
    params = {"default": reader.defaults.idle_timeout, "now": now}
    with reader.connection() as conn:
        rows = conn.execute(query("idle_candidates"), params).fetchall()
    due_of = {(a, c): max(due, now) for a, c, due in rows}
    armed = timers.scan()
    missing = [(a, c, due) for (a, c), due in due_of.items() if (a, c) not in armed]
    done = timers.arm_many(missing, now, only_if_missing=True) if missing else 0
    jobs = sorted({t.job for t in armed.values()})
    alive = dict(zip(jobs, timers.live(jobs, now), strict=True)) if jobs else {}
    dead = {c: t for c, t in armed.items() if not alive[t.job]}
    for bucket, job in {(t.bucket, t.job) for t in dead.values() if t.bucket}:
        timers.drop_bucket(bucket, job)  # so the re-arms below do not join it
    by_job: dict[str, list[Conversation]] = {}
    for conv, timer in dead.items():
        by_job.setdefault(timer.job, []).append(conv)
    for job, convs in by_job.items():
        done += timers.rearm_many(job, [(*c, due_of[c]) for c in convs if c in due_of], now)
        gone = [(c, dead[c].due_ms) for c in convs if c not in due_of]
        timers.disarm_many(job, gone)
    return done
