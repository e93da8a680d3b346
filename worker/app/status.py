"""What `contextlog status` reports: per-shard lag and pending work, dead letters, events
stored; job queues, idle timers, the summary backlog and failed jobs."""

from __future__ import annotations

import datetime as dt
import socket
from typing import Any

import msgspec
import psycopg
import redis
from rq import Queue
from rq.worker_registration import REDIS_WORKER_KEYS

from contextlog.schema import keys
from contextlog.schema.errors import one_line
from contextlog.schema.queries import query
from contextlog.worker.app import memory
from contextlog.worker.app.config import QUEUE_REDIS_VAR
from contextlog.worker.ingest import deadletters
from contextlog.worker.ingest.streams import entry_time_ms, id_key, outages, recent_failures
from contextlog.worker.tasks.queue import SUMMARIES
from contextlog.worker.tasks.rqworker import dead_because
from contextlog.worker.tasks.sweeper import BEAT_S, heartbeat_key, pid_namespace
from contextlog.worker.tasks.timers import IDLE


def _queue(client: redis.Redis, name: str, now: dt.datetime) -> QueueStatus:
    q = Queue(name, connection=client)
    scheduled = q.scheduled_job_registry
    overdue = len(scheduled.get_jobs_to_schedule(int(now.timestamp() - OVERDUE_S)))
    oldest = None
    first = q.get_job_ids(0, 1)
    if first:
        job = q.fetch_job(first[0])
        if job is not None and job.enqueued_at is not None:
            at = job.enqueued_at.replace(tzinfo=job.enqueued_at.tzinfo or dt.UTC)
            oldest = max(0.0, (now - at).total_seconds())
    return QueueStatus(
        name,
        q.count,
        scheduled.count,
        q.started_job_registry.count,
        q.failed_job_registry.count,
        oldest,
        overdue,
    )


class ShardStatus(msgspec.Struct, frozen=True):
    """One shard stream as its consumer group sees it."""

    shard: int
    stream_length: int
    lag: int | None
    pending: int
    oldest_pending_age_s: float | None
    owner: str | None
    events_stored: int
    oldest_waiting_age_s: float | None = None  # the oldest entry not yet acknowledged
    last_commit_age_s: float | None = None  # None: nothing committed yet


class RedisNode(msgspec.Struct, frozen=True):
    """One Redis node's memory, as `status` read it."""

    redis: str  # the variable naming it: REDIS_URL, CONTEXTLOG_QUEUE_REDIS_URL
    node: str
    used_bytes: int
    maxmemory: int  # 0: no limit
    policy: str
    evicted_keys: int


class QueueStatus(msgspec.Struct, frozen=True):
    """One RQ queue: jobs waiting, delayed (idle timers), running, failed."""

    name: str
    queued: int
    scheduled: int
    started: int
    failed: int
    oldest_queued_age_s: float | None
    overdue: int  # scheduled jobs past their time: nobody runs the scheduler


class RetentionStatus(msgspec.Struct, frozen=True):
    """The last retention step (worker/store/policy.py): when, what it removed, what waits."""

    started_at: dt.datetime
    finished_at: dt.datetime | None  # None: it is running, or its worker died in it
    conversations: int  # dropped whole
    events: int
    expiring: int  # conversations told to expire sessions
    pinned: int  # past their retention, held by a live session
    left_due: int  # past their retention, beyond the step's bound: the next step's
    error: str | None


class Status(msgspec.Struct, frozen=True):
    """The whole report; `healthy` is false when work waits that nothing will do."""

    healthy: bool
    problems: list[str]
    shards: list[ShardStatus]
    dead_letters: int
    dead_letters_by_reason: dict[str, int]
    events_stored: int
    ingest_consumers: int
    queues: list[QueueStatus] = []
    workers: int = 0
    scheduler: str | None = None  # the worker whose scheduler holds the lock
    summary_backlog: int = 0
    oldest_pending_summary_age_s: float | None = None
    effects_waiting: int = 0  # notices and jobs committed but not yet relayed
    redis: list[RedisNode] = []
    # Messages stored before search existed that the worker has not indexed yet.
    search_backfill_left: int = 0
    search_waiting: int = 0  # messages queued for the workers' search indexer
    search_lag_s: float | None = None  # how long the oldest of them has waited
    retention: RetentionStatus | None = None  # the last retention step; None: none ran


OVERDUE_S = 120.0  # a timer this late means no scheduler is running
SEARCH_STALE_S = 120.0  # a message unindexed this long: no worker's indexer runs


def _group(client: Any, stream: str) -> dict[str, Any] | None:
    try:
        groups = client.xinfo_groups(stream)
    except redis.ResponseError:  # no such stream yet
        return None
    for g in groups:
        name = g["name"].decode() if isinstance(g["name"], bytes) else g["name"]
        if name == keys.INGEST_GROUP:
            return dict(g)
    return None


def _holders(r: Any, shards: int) -> list[str | None]:
    """Each shard's lease holder: one GET per lease, pipelined (an MGET of keys in
    different slots is refused by a Redis Cluster)."""
    pipe = r.pipeline(transaction=False)
    for s in range(shards):
        pipe.get(keys.lease(s))
    return [h.decode() if h else None for h in pipe.execute()]


def _shard(
    client: Any,
    shard: int,
    owner: str | None,
    stored: int,
    now_ms: int,
    committed: float | None = None,
) -> ShardStatus:
    """A shard's row; `committed`: seconds since its last commit (None: never)."""
    stream = keys.stream(shard)
    length = int(client.xlen(stream))
    group = _group(client, stream)
    lag: int | None = length if group is None else group.get("lag")
    if lag is None and group is not None:
        lag = _lag_without_lag(client, stream, group, length)
    pending, age = 0, None
    if group is not None and group["pending"]:
        summary = client.xpending(stream, keys.INGEST_GROUP)
        pending = int(summary["pending"])
        if summary["min"] is not None:  # None: acknowledged since XINFO GROUPS looked
            age = max(0.0, (now_ms - entry_time_ms(_text(summary["min"]))) / 1000)
    waiting = (
        age if age is not None or not lag else _first_undelivered_age(client, stream, group, now_ms)
    )
    return ShardStatus(
        shard,
        length,
        None if lag is None else int(lag),
        pending,
        age,
        owner,
        stored,
        oldest_waiting_age_s=waiting,
        last_commit_age_s=committed,
    )


def _first_undelivered_age(
    client: Any, stream: str, group: dict[str, Any] | None, now_ms: int
) -> float | None:
    """How old the first entry no consumer has read yet is (the stream's first, while it
    has no group)."""
    after = "-" if group is None else f"({_text(group.get('last-delivered-id')) or '0-0'}"
    first = client.xrange(stream, min=after, max="+", count=1)
    if not first:
        return None
    return max(0.0, (now_ms - entry_time_ms(_text(first[0][0]))) / 1000)


LAG_COUNT_MAX = 10_000  # past this many undelivered entries, XLEN stands in for the lag


def _lag_without_lag(client: Any, stream: str, group: dict[str, Any], length: int) -> int:
    """The group's lag where XINFO GROUPS gives none (Redis < 7.0, or 7.x after a
    deletion): the entries after the group's last-delivered id, counted by XRANGE up to
    LAG_COUNT_MAX, XLEN beyond (an upper bound)."""
    delivered = _text(group.get("last-delivered-id")) or "0-0"
    newest = _text(client.xinfo_stream(stream).get("last-generated-id")) or "0-0"
    if id_key(delivered) >= id_key(newest):
        return 0
    after = client.xrange(stream, min=f"({delivered}", max="+", count=LAG_COUNT_MAX)
    return len(after) if len(after) < LAG_COUNT_MAX else length


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def shard_problems(rows: list[ShardStatus]) -> list[str]:
    """Shards with entries waiting and nobody to read them."""
    return [
        f"shard {row.shard} has work waiting and no ingest owner"
        for row in rows
        if row.owner is None and (row.pending or row.lag)
    ]


# A shard whose owner has committed nothing for this long while its oldest entry waits
# at least as long: its ingest is stuck (holding the lease, it keeps everyone else out).
STUCK_S = 30.0


def stuck_problems(rows: list[ShardStatus]) -> list[str]:
    """Shards an ingest holds and does not drain: work waits, nothing commits."""
    out = []
    for row in rows:
        waiting = row.oldest_waiting_age_s
        if row.owner is None or waiting is None or waiting < STUCK_S:
            continue
        idle = row.last_commit_age_s
        if idle is not None and idle < STUCK_S:
            continue  # a backlog, being worked through
        since = "has never committed" if idle is None else f"has committed nothing for {idle:.0f} s"
        count = row.pending + (row.lag or 0)
        entries = "1 entry waits" if count == 1 else f"{count} entries wait"
        out.append(
            f"ingest is stuck on shard {row.shard}: {row.owner} holds it and {since} while "
            f"{entries} (the oldest for {waiting:.0f} s)"
        )
    return out


DISK_FULL = ("No space left on device", "could not extend file", "53100")
# A new connection's relation cache file, which Postgres cannot write for want of disk
# (or of rights to its own data directory, which is not how a running server breaks).
CONNECT_DISK_FULL = (*DISK_FULL, "could not write init file")


def disk_full(error: str, connecting: bool = False) -> bool:
    """Whether a Postgres error says its disk is full (`connecting`: a refused connection)."""
    return any(s in error for s in (CONNECT_DISK_FULL if connecting else DISK_FULL))


def outage_problems(r: Any, now_ms: int) -> list[str]:
    """What live ingest consumers say they cannot reach, and for how long; a Postgres
    refusing writes for want of disk is named as such."""
    live = [_text(m) for m in r.zrangebyscore(keys.MEMBERS, now_ms, "+inf")]
    out = []
    for down in outages(r, live):
        took = max(0.0, (now_ms - down.since_ms) / 1000)
        if down.dependency == "postgres" and disk_full(down.error):
            what = "Postgres refuses writes: its disk is full"
        else:
            what = f"ingest cannot use {down.dependency.capitalize()}"
        out.append(f"{what} ({down.consumer}, for {took:.0f} s): {one_line(down.error)}")
    return out


def redis_memory(named: list[tuple[str, Any]]) -> tuple[list[RedisNode], list[str]]:
    """Each Redis's memory (a server named twice, as REDIS_URL and the queue Redis, once)
    and its problems: an evicting policy, evicted keys, full or nearly."""
    nodes: list[RedisNode] = []
    problems: list[str] = []
    seen: set[str] = set()
    for what, client in named:
        try:
            found = [m for m in memory.read(client) if m.node not in seen]
        except redis.ResponseError as e:  # an ACL user without +info
            problems.append(f"cannot read {what}'s memory and eviction policy: {e}")
            continue
        seen.update(m.node for m in found)
        problems += memory.problems(what, found)
        nodes += [RedisNode(what, m.node, m.used, m.limit, m.policy, m.evicted) for m in found]
    return nodes, problems


CRASH_WINDOW_S = 600  # ingest crashes counted over the last ten minutes
CRASH_LOOP = 3  # this many in the window: ingest is crash-looping


def ingest_problems(r: Any, now_ms: int) -> list[str]:
    """Ingest crashing again and again: in-process crashes it survived, and runs that ended
    without a clean stop (SIGKILL, OOM, a supervisor restarting a dying process). Leases
    and membership cannot tell: the crashing consumer may hold them all along."""
    live = [_text(m) for m in r.zrangebyscore(keys.MEMBERS, now_ms, "+inf")]
    failures = recent_failures(r, live, now_ms - CRASH_WINDOW_S * 1000)
    if len(failures) < CRASH_LOOP:
        return []
    last = failures[-1]
    return [
        f"ingest is crash-looping: {len(failures)} crashes in the last "
        f"{CRASH_WINDOW_S // 60} min (latest: {last.consumer}: {last.error})"
    ]


BEAT_STALE_S = 4 * BEAT_S  # a sweeper unheard of this long: its worker is dead or hung
SWEEP_STALE_FACTOR = 3  # and one without a completed cycle for 3 intervals (+ a minute)


def workers_alive(r: Any, now: dt.datetime) -> tuple[int, list[str]]:
    """How many registered RQ workers are alive, and a problem line for each that is not:
    its registration expired without a clean exit; its pid is gone on this host; its
    sweeper thread died, went silent, or has not completed a cycle for far longer than
    its CONTEXTLOG_SWEEP_SECONDS."""
    at = now.timestamp()
    alive, problems = 0, []
    for key in sorted(_text(k) for k in r.smembers(REDIS_WORKER_KEYS)):
        name = key.removeprefix("rq:worker:")
        worker = _fields(r.hgetall(key))
        if "death" in worker:
            continue  # a clean exit RQ has not unregistered yet
        beat = _fields(r.hgetall(heartbeat_key(name)))
        why = _worker_gone(worker, beat, at)
        if why:
            problems.append(f"worker {name} is gone: {why}")
            continue
        alive += 1
        problems += [f"worker {name}: {p}" for p in _sweeper_problems(beat, at)]
    return alive, problems


def _worker_gone(worker: dict[str, str], beat: dict[str, str], at: float) -> str | None:
    if not worker:
        return "its registration expired without a clean exit"
    if beat.get("pid") == worker.get("pid") and "pidns" in beat:
        worker = {**worker, "pidns": beat["pidns"]}
    why = dead_because(worker, host=socket.gethostname(), pid=0, pidns=pid_namespace())
    if why:
        return why
    if "died" not in beat and (silent := at - float(beat.get("beat", at))) > BEAT_STALE_S:
        return f"not heard from for {silent:.0f} s (its sweeper beats every {BEAT_S:.0f} s)"
    return None


def _sweeper_problems(beat: dict[str, str], at: float) -> list[str]:
    if not beat:
        return []  # a worker that keeps no heartbeat (plain `rq worker`, an older version)
    if "died" in beat:
        return [f"its sweeper thread died: {beat.get('died_error', '?')}"]
    every = float(beat.get("every", 0))
    last = float(beat.get("swept", beat.get("started", at)))
    if at - last <= SWEEP_STALE_FACTOR * every + 60:
        return []
    error = f" (last error: {beat['error']})" if "error" in beat else ""
    return [
        f"its sweeper has not completed a cycle for {at - last:.0f} s (every {every:g} s){error}"
    ]


def _fields(raw: dict[Any, Any]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in raw.items()}


def gather(
    client: Any,
    conn: psycopg.Connection[Any],
    shards: int,
    now: dt.datetime,
    queue_client: redis.Redis | None = None,
) -> Status:
    """Read the status of every shard from Redis (or Redis Cluster), the queues, timers and
    workers from the queue Redis (`queue_client`, default: the same), and the stored
    counts from Postgres."""
    r: Any = client  # replies are bytes: decode_responses is off
    q: Any = queue_client if queue_client is not None else client
    checkpoints = conn.execute(query("checkpoints")).fetchall()
    stored = {int(shard): int(events) for shard, _epoch, _entry_id, events, _at in checkpoints}
    committed = {
        int(shard): max(0.0, (now - at).total_seconds()) for shard, _, _, _, at in checkpoints
    }
    conn.rollback()
    holders = _holders(r, shards)
    now_ms = int(now.timestamp() * 1000)
    rows = [
        _shard(r, s, holders[s], stored.get(s, 0), now_ms, committed.get(s)) for s in range(shards)
    ]
    reasons = deadletters.by_reason(r, shards)
    consumers = int(r.zcount(keys.MEMBERS, now_ms, "+inf"))
    nodes, memory_problems = redis_memory([("REDIS_URL", r), (QUEUE_REDIS_VAR, q)])
    problems = memory_problems + outage_problems(r, now_ms) + stuck_problems(rows)
    problems += shard_problems(rows) + ingest_problems(r, now_ms)
    queues = [_queue(q, name, now) for name in (IDLE, SUMMARIES)]
    workers, gone = workers_alive(q, now)
    problems += gone
    lock = q.get(f"rq:scheduler-lock:{IDLE}")
    backlog, oldest = conn.execute(query("summary_backlog")).fetchone() or (0, None)
    (waiting,) = conn.execute(query("effects_waiting")).fetchone() or (0,)
    (backfill,) = conn.execute(query("search_backfill_left")).fetchone() or (0,)
    waiting, oldest = conn.execute(query("search_lag")).fetchone() or (0, None)
    behind = None if oldest is None else max(0.0, (now - oldest).total_seconds())
    if behind is not None and behind > SEARCH_STALE_S:
        problems.append(
            f"the search index is {waiting} messages behind (the oldest waits {behind:.0f} s):"
            " is a worker running?"
        )
    last = conn.execute(query("retention_last_run")).fetchone()
    conn.rollback()
    kept = RetentionStatus(*last) if last else None
    if kept is not None and kept.error:
        problems.append(f"the last retention step failed: {kept.error}")
    for q in queues:
        if (q.queued or q.overdue) and not workers:
            problems.append(f"queue {q.name} has jobs and no worker is running")
        elif q.overdue:
            problems.append(f"{q.overdue} {q.name} jobs are overdue: is a scheduler running?")
    return Status(
        queues=queues,
        workers=workers,
        scheduler=lock.decode() if lock else None,
        summary_backlog=int(backlog),
        oldest_pending_summary_age_s=None if oldest is None else (now - oldest).total_seconds(),
        effects_waiting=int(waiting),
        redis=nodes,
        search_backfill_left=int(backfill),
        search_waiting=int(waiting),
        search_lag_s=behind,
        retention=kept,
        healthy=not problems,
        problems=problems,
        shards=rows,
        dead_letters=deadletters.count(r, shards),
        dead_letters_by_reason=reasons,
        events_stored=sum(stored.values()),
        ingest_consumers=consumers,
    )
