"""Idle timers in Redis, and the delayed RQ jobs that check them, one per due second.

A conversation's timer is a hash (`timer_key`): the newest deadline (`due`), the job
that will check it (`job`) and the deadline that job was armed for (`job_due`). A timer
does not get a job of its own: it joins its deadline's *bucket*, one delayed job for
every timer due in the same second (`bucket_key`). A storm of conversations going idle
together is then one RQ job, not ten thousand: RQ's scheduler moves at most 1,000 jobs a
pass and a worker runs a few hundred a second, so a job per conversation made the last
of 10,000 saves a minute late.

When its second comes, the bucket's job *takes* the bucket (reads and deletes it in one
script: a timer armed afterwards for that second starts a new bucket and job) and hands
its timers on in parts (`PART` each) to jobs queued at once, so the workers share a
storm and no job runs long enough to be taken for dead. Every hand-over is a
compare-and-set on the timer's `job`, so a job that finds its timer taken by another
does nothing ("superseded"). Job ids are never reused: RQ overwrites a job whose id is.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis
import structlog
from rq import Queue
from rq.job import Job, JobStatus

from contextlog.schema import keys
from contextlog.worker.tasks.queue import JOBS_MODULE

log = structlog.get_logger("contextlog.idle")

IDLE: Final = "idle"
STUCK_S: Final = 10.0  # an idle check running this long is taken for dead
KEEP_MS: Final = 3_600_000  # a timer outlives its deadline by this, then Redis drops it
PART: Final = 500  # timers one job checks (one Postgres query, one Redis pipeline)
_LIVE: Final = (JobStatus.SCHEDULED, JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED)
_JOBS: Final = JOBS_MODULE

Conversation = tuple[str, str]

# Put timer `tkey` into bucket `bkey`, which is created with job `cand` if missing (then
# 1 is returned: the caller schedules that job); the bucket's job becomes the timer's.
_JOIN: Final = """
local function join(tkey, bkey, cand, job_due, keep)
  local job = redis.call('HGET', bkey, 'job')
  local new = 0
  if not job then
    job = cand
    redis.call('HSET', bkey, 'job', job)
    new = 1
  end
  redis.call('HSET', bkey, tkey, '1')
  if redis.call('PTTL', bkey) < tonumber(keep) then redis.call('PEXPIRE', bkey, keep) end
  redis.call('HSET', tkey, 'job', job, 'job_due', job_due, 'bucket', bkey)
  return new
end
"""
# For each timer (KEYS: timer, bucket, ...): record the newest deadline; when no timer
# exists, or the new deadline comes before the armed one (the timeout was shortened),
# join the deadline's bucket. ARGV[1] only_if_missing, then per timer due_ms, candidate
# job, keep_ms, agent, channel. Per timer: 0 nothing to do, 1 joined, 2 joined a new
# bucket (its job is to be scheduled).
_ARM: Final = (
    _JOIN
    + """
local out = {}
for i = 1, #KEYS / 2 do
  local tkey, bkey = KEYS[2 * i - 1], KEYS[2 * i]
  local a = 1 + (i - 1) * 5
  local new = tonumber(ARGV[a + 1])
  local job_due = tonumber(redis.call('HGET', tkey, 'job_due') or '-1')
  out[i] = 0
  if job_due < 0 then
    redis.call('HSET', tkey, 'due', ARGV[a + 1], 'agent', ARGV[a + 4], 'channel', ARGV[a + 5])
    redis.call('PEXPIRE', tkey, ARGV[a + 3])
    out[i] = 1 + join(tkey, bkey, ARGV[a + 2], ARGV[a + 1], ARGV[a + 3])
  elseif ARGV[1] ~= '1' then
    if new > tonumber(redis.call('HGET', tkey, 'due')) then
      redis.call('HSET', tkey, 'due', ARGV[a + 1])
    end
    redis.call('PEXPIRE', tkey, ARGV[a + 3])
    if new < job_due then
      out[i] = 1 + join(tkey, bkey, ARGV[a + 2], ARGV[a + 1], ARGV[a + 3])
    end
  end
end
return out
"""
)
# Pass a timer from job ARGV[1] to the bucket of deadline ARGV[3] (a re-arm). Returns 0
# when ARGV[1] no longer owns it, else 1 + join's answer.
_HANDOFF: Final = (
    _JOIN
    + """
if redis.call('HGET', KEYS[1], 'job') ~= ARGV[1] then return 0 end
if tonumber(ARGV[3]) > tonumber(redis.call('HGET', KEYS[1], 'due') or '0') then
  redis.call('HSET', KEYS[1], 'due', ARGV[3])
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
return 1 + join(KEYS[1], KEYS[2], ARGV[2], ARGV[3], ARGV[4])
"""
)
# Job ARGV[1] is done with a timer: delete it unless a message moved its deadline since
# the job read it (ARGV[2]); then return -1 and the job re-arms. 0: not this job's timer.
_DISARM: Final = """
if redis.call('HGET', KEYS[1], 'job') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'due') ~= ARGV[2] then return -1 end
redis.call('DEL', KEYS[1])
return 1
"""
# The bucket's job ARGV[1] takes it: its timer keys, and the bucket is gone. Nothing if
# the bucket has another job (the sweep replaced a dead one).
_TAKE: Final = """
if redis.call('HGET', KEYS[1], 'job') ~= ARGV[1] then return {} end
local members = redis.call('HKEYS', KEYS[1])
redis.call('DEL', KEYS[1])
return members
"""
# Hand the timers (KEYS) owned by job ARGV[1] to job ARGV[2]; 1 per timer handed over.
_REOWN: Final = """
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = 0
  if redis.call('HGET', key, 'job') == ARGV[1] then
    redis.call('HSET', key, 'job', ARGV[2])
    out[i] = 1
  end
end
return out
"""


def _conv_hash(agent: str, channel: str) -> str:
    return hashlib.sha1(f"{agent}\x00{channel}".encode()).hexdigest()[:20]


def timer_key(agent: str, channel: str) -> str:
    """The Redis hash of a conversation's timer (its hash in braces: one slot)."""
    return keys.idle_timer(_conv_hash(agent, channel))


def bucket_second(due_ms: int) -> int:
    """The epoch second whose bucket checks a deadline: the first at or after it."""
    return -(-due_ms // 1000)


def bucket_key(second: int) -> str:
    """The Redis hash of one second's bucket: its job and its timers' keys."""
    return keys.idle_bucket(second)


def ms(at: dt.datetime) -> int:
    """Epoch milliseconds."""
    return int(at.timestamp() * 1000)


def keep_ms(due: dt.datetime, now: dt.datetime) -> int:
    """How long Redis keeps a timer: until its deadline and an hour more."""
    return max(ms(due) - ms(now), 0) + KEEP_MS


def _new_id(kind: str, second: int, nonce: str) -> str:
    return f"idle-{kind}-{second}-{nonce}"


@dataclass(frozen=True)
class Timer:
    """A conversation's armed timer as Redis holds it."""

    job: str
    due_ms: int
    bucket: str | None = None  # the bucket it joined (None: an older per-conversation job)

    @property
    def due(self) -> dt.datetime:
        """The newest deadline."""
        return dt.datetime.fromtimestamp(self.due_ms / 1000, dt.UTC)


def _timer(raw: Sequence[bytes | None]) -> Timer | None:
    job, due, bucket = raw[0], raw[1], raw[2]
    if job is None or due is None:
        return None
    return Timer(job.decode(), int(due), bucket.decode() if bucket else None)


class Timers:
    """The timers in Redis and their jobs on the `idle` queue."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis: Any = client
        self.queue = Queue(IDLE, connection=client)
        self._arm = client.register_script(_ARM)
        self._handoff = client.register_script(_HANDOFF)
        self._disarm = client.register_script(_DISARM)
        self._take = client.register_script(_TAKE)
        self._reown = client.register_script(_REOWN)

    # -- arming ---------------------------------------------------------------------
    def arm_many(
        self,
        timers: Sequence[tuple[str, str, dt.datetime]],
        now: dt.datetime,
        only_if_missing: bool = False,
    ) -> int:
        """Arm (agent, channel, deadline) timers with one Redis call (a script over all
        of them), then schedule the job of each bucket that call created. Returns how
        many jobs were scheduled."""
        if not timers:
            return 0
        nonce = uuid.uuid4().hex[:8]  # job ids are never reused
        keys: list[str] = []
        args: list[str | int] = [int(only_if_missing)]
        jobs: list[tuple[str, int]] = []
        for agent, channel, due in timers:
            due_ms = ms(due)
            second = bucket_second(due_ms)
            job = _new_id("due", second, nonce)
            keys += [timer_key(agent, channel), bucket_key(second)]
            args += [due_ms, job, keep_ms(due, now), agent, channel]
            jobs.append((job, second))
        armed: Any = self._arm(keys=keys, args=args)
        created = {job: second for (job, second), out in zip(jobs, armed, strict=True) if out == 2}
        self._schedule(created)
        return len(created)

    def rearm_many(
        self, owner: str, timers: Sequence[tuple[str, str, dt.datetime]], now: dt.datetime
    ) -> int:
        """Move timers from job `owner` to the buckets of their new deadlines; returns
        how many were moved (a timer `owner` no longer holds stays as it is)."""
        if not timers:
            return 0
        nonce = uuid.uuid4().hex[:8]
        pipe = self.redis.pipeline(transaction=False)
        jobs: list[tuple[str, int]] = []
        for agent, channel, due in timers:
            due_ms = ms(due)
            second = bucket_second(due_ms)
            job = _new_id("due", second, nonce)
            keys = [timer_key(agent, channel), bucket_key(second)]
            self._handoff(keys=keys, args=[owner, job, due_ms, keep_ms(due, now)], client=pipe)
            jobs.append((job, second))
        moved = pipe.execute()
        created = {job: second for (job, second), out in zip(jobs, moved, strict=True) if out == 2}
        self._schedule(created)
        return sum(1 for out in moved if out)

    def _schedule(self, jobs: Mapping[str, int]) -> None:
        """The delayed jobs (id -> second) that check new buckets' timers at their second,
        in one pipeline: a batch that arms a thousand conversations can open hundreds of
        buckets, and a round trip each was ~5% of ingest's time. Their ids are never
        reused (`arm_many`'s nonce), so RQ's uniqueness check (a script a job) is not
        needed."""
        if not jobs:
            return
        pipe = self.queue.connection.pipeline()
        for job_id, second in jobs.items():
            at = dt.datetime.fromtimestamp(second, dt.UTC)
            self.queue.enqueue_at(
                at,
                f"{_JOBS}.idle_due",
                bucket_key(second),
                job_id=job_id,
                description=f"idle checks due at {at:%H:%M:%S} UTC",
                result_ttl=600,
                failure_ttl=86_400,
                pipeline=pipe,
            )
        pipe.execute()

    # -- the jobs' side ---------------------------------------------------------------
    def take(self, bucket: str, job_id: str) -> list[Conversation]:
        """The bucket's conversations, for its job `job_id`; the bucket is gone after."""
        keys: Any = self._take(keys=[bucket], args=[job_id])
        members = [k.decode() for k in keys if k != b"job"]
        return [c for c, t in self.read_keys(members).items() if t is not None]

    def hand_out(self, owner: str, convs: Sequence[Conversation]) -> list[str]:
        """Split `owner`'s conversations into parts of `PART` and queue a job for each
        part at once (the workers share them); returns the jobs' ids."""
        ids = []
        for i in range(0, len(convs), PART):
            part = list(convs[i : i + PART])
            job_id = f"idle-part-{uuid.uuid4().hex}"
            self._reown(keys=[timer_key(a, c) for a, c in part], args=[owner, job_id])
            self.queue.enqueue(
                f"{_JOBS}.idle_part",
                part,
                job_id=job_id,
                description=f"idle checks ({len(part)} conversations)",
                result_ttl=600,
                failure_ttl=86_400,
            )
            ids.append(job_id)
        return ids

    def read(self, agent: str, channel: str) -> Timer | None:
        """The conversation's timer, if armed."""
        return self.read_many([(agent, channel)])[(agent, channel)]

    def read_many(self, convs: Sequence[Conversation]) -> dict[Conversation, Timer | None]:
        """The timers of these conversations, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for agent, channel in convs:
            pipe.hmget(timer_key(agent, channel), ["job", "due", "bucket"])
        return {c: _timer(raw) for c, raw in zip(convs, pipe.execute(), strict=True)}

    def read_keys(self, keys: Sequence[str]) -> dict[Conversation, Timer | None]:
        """The timers stored under these keys, by conversation (keys gone are left out)."""
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, ["job", "due", "bucket", "agent", "channel"])
        out: dict[Conversation, Timer | None] = {}
        for raw in pipe.execute():
            if raw[3] is not None and raw[4] is not None:
                out[(raw[3].decode(), raw[4].decode())] = _timer(raw)
        return out

    def scan(self) -> dict[Conversation, Timer]:
        """Every armed timer, by conversation (a SCAN: for the periodic sweep only)."""
        found_keys = self.redis.scan_iter(match=keys.idle_timer("*"), count=1000)
        found = self.read_keys([k.decode() for k in found_keys])
        return {c: t for c, t in found.items() if t is not None}

    def disarm_many(self, owner: str, timers: Sequence[tuple[Conversation, int]]) -> list[int]:
        """Per (conversation, deadline seen): 1 deleted; -1 a message moved the deadline,
        re-arm; 0 not `owner`'s. One round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for (agent, channel), seen_due_ms in timers:
            self._disarm(
                keys=[timer_key(agent, channel)], args=[owner, str(seen_due_ms)], client=pipe
            )
        return [int(x) for x in pipe.execute()] if timers else []

    def drop_bucket(self, bucket: str, job_id: str) -> None:
        """Forget a bucket whose job died, so timers armed for its second start anew."""
        self._take(keys=[bucket], args=[job_id])

    def live(self, job_ids: Sequence[str], now: dt.datetime) -> list[bool]:
        """Whether each job is still scheduled, queued or running. A check runs for
        well under STUCK_S: one started longer ago died with its worker (a second check
        is harmless, its events have the same ids). A job said to be queued must be in
        the queue: a worker killed between popping it and marking it started loses it,
        with its status left at `queued` for good."""
        jobs = Job.fetch_many(list(job_ids), connection=self.redis)
        queued: set[str] = set()
        if any(j is not None and j.get_status(refresh=False) == JobStatus.QUEUED for j in jobs):
            queued = set(self.queue.get_job_ids())  # one read for the whole sweep
        overdue = self._overdue(now)
        return [j is not None and _alive(j, now, queued) and j.id not in overdue for j in jobs]

    def _overdue(self, now: dt.datetime) -> set[str]:
        """Scheduled jobs whose time passed STUCK_S ago and that RQ's scheduler has not
        moved to the queue: a scheduler killed mid-pass can leave one so, and its timers
        would wait for ever."""
        registry = self.queue.scheduled_job_registry
        late = now.timestamp() - STUCK_S
        ids: Any = self.redis.zrangebyscore(registry.key, 0, late)
        return {i.decode() for i in ids}


def _alive(job: Job, now: dt.datetime, queued: set[str]) -> bool:
    status = job.get_status(refresh=False)
    if status == JobStatus.STARTED and job.started_at is not None:
        started = job.started_at.replace(tzinfo=job.started_at.tzinfo or dt.UTC)
        return (now - started).total_seconds() < STUCK_S
    if status == JobStatus.QUEUED:
        return job.id in queued
    return status in _LIVE
