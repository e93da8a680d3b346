"""Idle-timeout auto-save: a debounced timer per conversation, as delayed RQ jobs.

A batch of messages costs one Redis command per conversation (the `arm` script): it
records the newest deadline and schedules a job on the `idle` queue only when no timer
is armed, so a conversation has one job per idle period, never one per message. When
the job fires it reads the conversation in Postgres: activity since means a new job for
the new deadline (under a new id: RQ would overwrite a job whose id is reused, and the
timer would be lost silently); silence with messages newer than the last save or clear
means an auto-save and a clear, pushed with ids derived from the last message, so two
workers, a redelivered job or a rerun after SIGKILL store them once. Timers live in
Redis; `sweep` re-arms from the Postgres projection whatever Redis lost.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import redis
import structlog
from rq import Queue
from rq.exceptions import DuplicateJobError
from rq.job import Job, JobStatus

from contextlog.producers.ids import derived_id
from contextlog.schema import events as ev
from contextlog.schema.queries import query
from contextlog.worker import metrics

if TYPE_CHECKING:
    from contextlog.producers.reader import ContextReader
    from contextlog.worker.bootstrap import Resources

log = structlog.get_logger("contextlog.idle")

IDLE: Final = "idle"
JOB_SOURCE: Final = "contextlog-idle"  # namespace of the derived auto-save event ids
STUCK_S: Final = 10.0  # an idle check running this long is taken for dead
KEEP_MS: Final = 3_600_000  # a timer outlives its deadline by this, then Redis drops it
_LIVE: Final = (JobStatus.SCHEDULED, JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED)

# For each timer KEYS[i]: record the newest deadline; arm (return 1: the caller schedules
# the job) when no timer exists, or when the new deadline comes before the armed job's
# (the timeout was shortened), which leaves that job superseded. One call arms a whole
# batch: ARGV[1] only_if_missing, then per key due_ms, job, keep_ms, agent, channel.
_ARM = """
local out = {}
for i, key in ipairs(KEYS) do
  local a = 1 + (i - 1) * 5
  local new = tonumber(ARGV[a + 1])
  local job_due = tonumber(redis.call('HGET', key, 'job_due') or '-1')
  out[i] = 0
  if job_due < 0 then
    redis.call('HSET', key, 'due', ARGV[a + 1], 'job', ARGV[a + 2], 'job_due', ARGV[a + 1],
               'agent', ARGV[a + 4], 'channel', ARGV[a + 5])
    redis.call('PEXPIRE', key, ARGV[a + 3])
    out[i] = 1
  elseif ARGV[1] ~= '1' then
    if new > tonumber(redis.call('HGET', key, 'due')) then
      redis.call('HSET', key, 'due', ARGV[a + 1])
    end
    redis.call('PEXPIRE', key, ARGV[a + 3])
    if new < job_due then
      redis.call('HSET', key, 'job', ARGV[a + 2], 'job_due', ARGV[a + 1])
      out[i] = 1
    end
  end
end
return out
"""
# Pass the timer from job ARGV[1] to job ARGV[2] (a re-arm); 0 if ARGV[1] no longer owns it.
_HANDOFF = """
if redis.call('HGET', KEYS[1], 'job') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'job', ARGV[2], 'job_due', ARGV[3])
if tonumber(ARGV[3]) > tonumber(redis.call('HGET', KEYS[1], 'due') or '0') then
  redis.call('HSET', KEYS[1], 'due', ARGV[3])
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
return 1
"""
# Job ARGV[1] is done: delete the timer unless a message moved its deadline since the job
# read it (ARGV[2]); then return -1 and the job re-arms. 0: not this job's timer.
_DISARM = """
if redis.call('HGET', KEYS[1], 'job') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'due') ~= ARGV[2] then return -1 end
redis.call('DEL', KEYS[1])
return 1
"""


def _conv_hash(agent: str, channel: str) -> str:
    return hashlib.sha1(f"{agent}\x00{channel}".encode()).hexdigest()[:20]


def timer_key(agent: str, channel: str) -> str:
    """The Redis hash of a conversation's timer (its hash in braces: one slot)."""
    return f"contextlog:idle:{{{_conv_hash(agent, channel)}}}"


def new_job_id(agent: str, channel: str, due_ms: int) -> str:
    """A job id never used before: RQ overwrites a job whose id is reused."""
    return f"idle-{_conv_hash(agent, channel)}-{due_ms}-{uuid.uuid4().hex[:8]}"


def keep_ms(due: dt.datetime, now: dt.datetime) -> int:
    """How long Redis keeps a timer: until its deadline and an hour more."""
    return max(ms(due) - ms(now), 0) + KEEP_MS


def ms(at: dt.datetime) -> int:
    """Epoch milliseconds."""
    return int(at.timestamp() * 1000)


def human(seconds: int) -> str:
    """`30 min`, `90 s`, `2 h`: how long a conversation was idle."""
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


@dataclass(frozen=True)
class Timer:
    """A conversation's armed timer as Redis holds it."""

    job: str
    due_ms: int


class Timers:
    """The timers in Redis and their jobs on the `idle` queue."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self.queue = Queue(IDLE, connection=client)
        self._arm = client.register_script(_ARM)
        self._handoff = client.register_script(_HANDOFF)
        self._disarm = client.register_script(_DISARM)

    def arm_many(
        self,
        timers: Sequence[tuple[str, str, dt.datetime]],
        now: dt.datetime,
        only_if_missing: bool = False,
    ) -> int:
        """Arm (agent, channel, deadline) timers with one Redis call (a Lua script over
        all of them); schedules a job for each conversation that had none. Returns how
        many jobs were scheduled."""
        if not timers:
            return 0
        nonce = uuid.uuid4().hex[:8]  # job ids are never reused
        keys: list[str] = []
        ids: list[str] = []
        args: list[str | int] = [int(only_if_missing)]
        for agent, channel, due in timers:
            h, due_ms = _conv_hash(agent, channel), ms(due)
            job = f"idle-{h}-{due_ms}-{nonce}"
            keys.append(f"contextlog:idle:{{{h}}}")
            args += [due_ms, job, keep_ms(due, now), agent, channel]
            ids.append(job)
        armed: Any = self._arm(keys=keys, args=args)
        scheduled = 0
        for (agent, channel, due), job, new in zip(timers, ids, armed, strict=True):
            if new:
                self.schedule(agent, channel, due, job)
                scheduled += 1
        return scheduled

    def schedule(self, agent: str, channel: str, due: dt.datetime, job_id: str) -> None:
        """The delayed job that checks the conversation at `due`."""
        try:
            self.queue.enqueue_at(
                due,
                "contextlog.worker.jobs.idle_check",
                agent,
                channel,
                job_id=job_id,
                description=f"idle check {agent}/{channel} at {due:%H:%M:%S} UTC",
                result_ttl=600,
                failure_ttl=86_400,
                unique=True,
            )
        except DuplicateJobError:  # pragma: no cover - ids are never reused
            log.warning("idle job id taken", job=job_id)

    def read(self, agent: str, channel: str) -> Timer | None:
        """The conversation's timer, if armed."""
        raw: dict[bytes, bytes] = self.redis.hgetall(timer_key(agent, channel))  # type: ignore[assignment]
        if b"job" not in raw:
            return None
        return Timer(raw[b"job"].decode(), int(raw[b"due"]))

    def scan(self) -> dict[tuple[str, str], Timer]:
        """Every armed timer, by conversation (a SCAN: for the periodic sweep only)."""
        found: dict[tuple[str, str], Timer] = {}
        for key in self.redis.scan_iter(match="contextlog:idle:*", count=1000):
            raw: Any = self.redis.hmget(key, ["job", "due", "agent", "channel"])
            job, due, agent, channel = raw
            if job and due and agent is not None and channel is not None:
                found[(agent.decode(), channel.decode())] = Timer(job.decode(), int(due))
        return found

    def rearm(
        self, agent: str, channel: str, owner: str, due: dt.datetime, now: dt.datetime
    ) -> bool:
        """Move the timer from job `owner` to a new job at `due`; False if not its owner."""
        job = new_job_id(agent, channel, ms(due))
        args: list[str | int] = [owner, job, ms(due), keep_ms(due, now)]
        if not self._handoff(keys=[timer_key(agent, channel)], args=args):
            return False
        self.schedule(agent, channel, due, job)
        return True

    def disarm(self, agent: str, channel: str, owner: str, seen_due_ms: int) -> int:
        """1: deleted; -1: a message moved the deadline, re-arm; 0: not `owner`'s."""
        args = [owner, str(seen_due_ms)]
        return int(self._disarm(keys=[timer_key(agent, channel)], args=args))

    def live(self, job_ids: Sequence[str], now: dt.datetime) -> list[bool]:
        """Whether each job is still scheduled, queued or running. A check runs for
        milliseconds: one started STUCK_S ago died with its worker (a second check is
        harmless, its events have the same ids). A job said to be queued must be in the
        queue: a worker killed between popping it and marking it started loses it, with
        its status left at `queued` for good."""
        jobs = Job.fetch_many(list(job_ids), connection=self.redis)
        queued: set[str] = set()
        if any(j is not None and j.get_status(refresh=False) == JobStatus.QUEUED for j in jobs):
            queued = set(self.queue.get_job_ids())  # one read for the whole sweep
        return [j is not None and _alive(j, now, queued) for j in jobs]


def _alive(job: Job, now: dt.datetime, queued: set[str]) -> bool:
    status = job.get_status(refresh=False)
    if status == JobStatus.STARTED and job.started_at is not None:
        started = job.started_at.replace(tzinfo=job.started_at.tzinfo or dt.UTC)
        return (now - started).total_seconds() < STUCK_S
    if status == JobStatus.QUEUED:
        return job.id in queued
    return status in _LIVE


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


def read_state(reader: ContextReader, agent: str, channel: str) -> IdleState | None:
    """The conversation's idle inputs from the projection."""
    default = reader.defaults.idle_timeout
    with reader.connection() as conn:
        row = conn.execute(
            query("idle_state"), {"agent": agent, "channel": channel, "default": default}
        ).fetchone()
    return None if row is None else IdleState(*row)


def check(
    timers: Timers,
    agent: str,
    channel: str,
    job_id: str,
    state: Callable[[], IdleState | None],
    push: Callable[[list[ev.Event]], object],
    now: dt.datetime,
) -> str:
    """The idle job: re-arm, do nothing, or auto-save and clear; returns what it did."""
    timer = timers.read(agent, channel)
    if timer is None or timer.job != job_id:
        return "superseded"  # the sweep re-armed it, or it was already handled
    s = state()
    what = DISABLED if s is None else decide(s, now)
    metrics.IDLE_CHECKS.labels(what).inc()
    if what == WAIT and s is not None:
        due = s.deadline()
        assert due is not None
        timers.rearm(agent, channel, job_id, due, now)
        return WAIT
    if what == SAVE and s is not None:
        push(auto_save_events(agent, channel, s, now))
        due = s.deadline()
        if due is not None:
            metrics.IDLE_DELAY.observe(max(0.0, (now - due).total_seconds()))
        log.info("auto-saved after idle", agent=agent, channel=channel, idle_timeout=s.idle_timeout)
    if timers.disarm(agent, channel, job_id, timer.due_ms) == -1:
        # A message came while we worked: its deadline is the next check.
        fresh = timers.read(agent, channel)
        if fresh is not None:
            due = dt.datetime.fromtimestamp(fresh.due_ms / 1000, dt.UTC)
            timers.rearm(agent, channel, job_id, max(due, now), now)
    return what


def run_check(res: Resources, agent: str, channel: str, job_id: str) -> str:
    """`check` with the worker's resources: Postgres state, the producer, the clock."""
    return check(
        res.timers,
        agent,
        channel,
        job_id,
        lambda: read_state(res.reader, agent, channel),
        lambda events: res.producer.push_many(events, atomic=True),
        res.clock.now(),
    )


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
    keys = list(armed)
    alive = timers.live([armed[k].job for k in keys], now) if keys else []
    for key, ok in zip(keys, alive, strict=True):
        if ok:
            continue
        if key in due_of:
            done += timers.rearm(key[0], key[1], armed[key].job, due_of[key], now)
        else:
            timers.disarm(key[0], key[1], armed[key].job, armed[key].due_ms)
    return done
