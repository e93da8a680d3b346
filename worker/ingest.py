"""The ingest loop: shard streams -> one Postgres transaction per batch -> XACK.

Invariants kept here (DESIGN.md): an entry is acknowledged only after its transaction
commits; a shard has one owner at a time (an expiring lease, fenced in Postgres); bad
entries go to the dead-letter stream and never stop the loop; when Postgres or Redis
goes away nothing is acknowledged, and the loop backs off and carries on when it is back.
"""

from __future__ import annotations

import math
import threading
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import redis
import structlog

from schema import codec
from schema.errors import Conflict, EventRejected, Fenced, StorageRefused, Unavailable
from worker import metrics
from worker.clock import Clock
from worker.config import Settings
from worker.eventlog import Accepted, EventLog
from worker.streams import Entry, Rejected, Streams, id_key

log = structlog.get_logger("contextlog.ingest")

POISON = "poison"
EFFECTS_SWEEP_S = 10.0  # how often unsent effects are looked for
EFFECTS_GRACE_S = 30.0  # an effect this old was not sent by the batch that made it
DATABASE_REFUSED = "database_refused"


@dataclass
class Health:
    """Up/down state of each dependency, so an outage is logged once, not per retry."""

    down: dict[str, str] = field(default_factory=dict)

    def failed(self, name: str, error: BaseException) -> None:
        """Record a failure; logs only on the up -> down change."""
        if name not in self.down:
            log.warning("dependency unavailable, retrying", dependency=name, error=str(error))
        self.down[name] = str(error)

    def ok(self) -> None:
        """Everything worked: log each dependency that came back."""
        for name in list(self.down):
            log.info("dependency back", dependency=name)
            del self.down[name]


class Ingest:
    """One ingest process: owns a fair share of the shards and drains them into the log."""

    def __init__(
        self,
        settings: Settings,
        streams: Streams,
        open_log: Callable[[], EventLog],
        clock: Clock,
        stop: threading.Event | None = None,
        pause: Callable[[float], object] | None = None,
    ) -> None:
        self.settings = settings
        self.streams = streams
        self.open_log = open_log
        self.clock = clock
        self.stop = stop or threading.Event()
        # Waiting between retries; a stop request cuts it short. Tests pass a fake.
        self.pause = pause or self.stop.wait
        self.health = Health()
        self.owned: dict[int, int] = {}  # shard -> lease epoch
        # Shards to recover before reading new entries; True when we just took the lease
        # (what is pending was in flight when its reader died: a new delivery).
        self.recovering: dict[int, bool] = {}
        self._local = threading.local()  # each thread's EventLog
        self._logs: list[EventLog] = []
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._next_lease_check = 0.0
        self._next_sweep = 0.0
        self._next_trim = 0.0
        self._next_effects = 0.0
        self._backoff = 0.0
        self.stored = 0
        self.retries = 0  # passes that failed on an outage, for tests and metrics

    # -- lifecycle ----------------------------------------------------------------------
    def run(self) -> int:
        """Loop until `stop` is set; finish the batch in hand, release leases, return 0."""
        log.info("ingest started", consumer=self.streams.consumer, shards=self.settings.shards)
        while not self.stop.is_set():
            self.step()
        self.shutdown()
        log.info("ingest stopped", consumer=self.streams.consumer, stored=self.stored)
        return 0

    def step(self) -> None:
        """One pass: leases, recovery, one read and its batches, trimming; survive outages."""
        try:
            self.tick()
        except (redis.ConnectionError, redis.TimeoutError) as e:
            self._outage("redis", e)
        except Unavailable as e:
            self._close_db()
            self._outage("postgres", e)
        else:
            self._backoff = 0.0
            self.health.ok()

    def shutdown(self) -> None:
        """Let go of our shards so another process takes them at once."""
        try:
            for shard in list(self.owned):
                self.streams.release(shard)
            self.streams.leave()
        except redis.RedisError as e:
            log.warning("could not release leases", error=str(e))
        self.owned.clear()
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None
        self._close_db()

    def _outage(self, name: str, error: BaseException) -> None:
        self.health.failed(name, error)
        self.retries += 1
        # What was read and not committed is still pending with us: re-read it first.
        for shard in self.owned:
            self.recovering.setdefault(shard, False)
        self._backoff = min(self.settings.backoff_max, max(0.05, self._backoff * 2))
        self.pause(self._backoff)

    # -- one pass -------------------------------------------------------------------------
    def tick(self) -> None:
        """Renew or rebalance leases when due, recover taken-over shards, then read."""
        now = self.clock.monotonic()
        if now >= self._next_lease_check:
            # Often (at least once a second), so a process that joins gets its share
            # of the shards quickly; renewing is two cheap pipelines.
            self.rebalance()
            self._next_lease_check = now + min(1.0, self.settings.lease_seconds / 3)
        if now >= self._next_sweep:
            # Sweep for entries a former owner read after we took its shard over.
            for shard in self.owned:
                self.recovering.setdefault(shard, False)
            self._next_sweep = now + self.settings.lease_seconds / 3
        for shard, taken in sorted(self.recovering.items()):
            self.recover(shard, taken)
        if not self.owned:
            self.pause(min(1.0, self.settings.lease_seconds / 3))
            return
        shards = sorted(self.owned)
        work = [(s, e) for s, e in self._read(shards).items() if s in self.owned and e]
        if len(work) > 1 and self.settings.ingest_threads > 1:
            # Shards are independent: while one thread waits on Postgres (psycopg
            # releases the GIL), another decodes and formats the next shard's batch.
            futures = [self._pool().submit(self.process, s, e) for s, e in work]
            wait(futures)  # all done before an error closes the connections they use
            for f in futures:
                f.result()  # re-raises an outage here, in the loop's thread
        else:
            for shard, entries in work:
                self.process(shard, entries)
        if self.settings.trim_seconds and now >= self._next_trim:
            for shard in list(self.owned):
                self.streams.trim(shard)
            self._next_trim = now + self.settings.trim_seconds
        if now >= self._next_effects:
            # Effects a crash or a Redis outage left between commit and relay.
            if sent := self._log().flush_effects(older_than=EFFECTS_GRACE_S):
                log.info("effects relayed by the sweep", count=sent)
            self._next_effects = now + EFFECTS_SWEEP_S

    def _read(self, shards: Sequence[int]) -> dict[int, list[Entry]]:
        try:
            return self.streams.read_new(shards, self.settings.batch_size, self.settings.block_ms)
        except redis.ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
            # Redis lost its data (or someone deleted a stream): recreate and carry on.
            log.warning("consumer group missing, recreating", error=str(e))
            for shard in shards:
                self.streams.ensure_group(shard)
            return {}

    # -- leases ---------------------------------------------------------------------------
    def rebalance(self) -> None:
        """Keep our fair share of shards: renew, give back extras, take free ones."""
        ttl_ms = int(self.settings.lease_seconds * 1000)
        now_ms = int(self.clock.now().timestamp() * 1000)
        members = self.streams.heartbeat(now_ms, ttl_ms)
        fair = math.ceil(self.settings.shards / max(1, members))
        for shard in self.streams.renew(sorted(self.owned), ttl_ms):
            log.warning("lease lost", shard=shard)
            self._drop(shard)
        for shard in sorted(self.owned, reverse=True)[: max(0, len(self.owned) - fair)]:
            self.streams.release(shard)
            self._drop(shard)
            log.info("lease given back for balance", shard=shard)
        if len(self.owned) < fair:
            self._take(fair, ttl_ms)

    def _take(self, fair: int, ttl_ms: int) -> None:
        floors = self._log().epochs()
        start = zlib.crc32(self.streams.consumer.encode()) % self.settings.shards
        for i in range(self.settings.shards):
            shard = (start + i) % self.settings.shards
            if len(self.owned) >= fair:
                return
            if shard in self.owned:
                continue
            epoch = self.streams.acquire(shard, ttl_ms, floors.get(shard, 0))
            if epoch is not None:
                self.streams.ensure_group(shard)
                self.owned[shard] = epoch
                self.recovering[shard] = True
                log.info("lease taken", shard=shard, epoch=epoch)

    def _drop(self, shard: int) -> None:
        self.owned.pop(shard, None)
        self.recovering.pop(shard, None)

    # -- batches --------------------------------------------------------------------------
    def recover(self, shard: int, taken: bool) -> None:
        """Before new entries: our own pending ones, then those of former owners, in order.

        Re-reading our own entries counts as a delivery only when we just took the
        lease (a restart: they may be what killed us), not after an outage.
        """
        own = (
            self.streams.read_own_pending(shard)
            if taken
            else self.streams.reload_own_pending(shard)
        )
        suspect = self.streams.inflight(shard) if taken else None
        entries = dict(own)
        entries.update(self.streams.claim_from_others(shard))
        ordered = sorted(entries.items(), key=lambda kv: id_key(kv[0]))
        counts = self.streams.deliveries(shard, [k for k, _ in ordered])
        size = self.settings.batch_size
        for i in range(0, len(ordered), size):
            if shard not in self.owned:
                return
            self.process(shard, ordered[i : i + size], counts, suspect)
        self.recovering.pop(shard, None)

    def process(
        self,
        shard: int,
        entries: Sequence[Entry],
        deliveries: dict[str, int] | None = None,
        suspect: str | None = None,
    ) -> None:
        """Dead-letter what is bad, append the rest in one transaction, then XACK.

        Entries that were in flight when an ingest died (delivered more than once) are
        stored one at a time under an in-flight marker, so that if one of them kills the
        process again, the next owner knows which: only that entry, the `suspect`, is
        dead-lettered as poison once delivered more than `max_deliveries` times. Valid
        entries that merely shared its batch are never condemned with it.
        """
        deliveries = deliveries or {}
        accepted, rejected = self._sort_out(entries, deliveries, suspect)
        if rejected:
            self.streams.dead_letter(shard, rejected)
            for r in rejected:
                metrics.DEAD_LETTERS.labels(r.reason).inc()
            for r in rejected:
                log.warning(
                    "entry dead-lettered", shard=shard, entry_id=r.entry_id, reason=r.reason
                )
        if not accepted:
            return
        if all(deliveries.get(a.entry_id, 1) == 1 for a in accepted):
            self._store(shard, accepted)
            return
        for a in accepted:
            if shard not in self.owned:
                return
            self.streams.mark_inflight(shard, a.entry_id)
            self._store(shard, [a])
        self.streams.mark_inflight(shard, None)

    def _sort_out(
        self, entries: Sequence[Entry], deliveries: dict[str, int], suspect: str | None
    ) -> tuple[list[Accepted], list[Rejected]]:
        accepted: list[Accepted] = []
        rejected: list[Rejected] = []
        cap = self.settings.max_entry_bytes
        for entry_id, fields in entries:
            times = deliveries.get(entry_id, 1)
            if entry_id == suspect and times > self.settings.max_deliveries:
                rejected.append(Rejected(entry_id, fields, POISON, f"delivered {times} times"))
                continue
            try:
                event = codec.decode_fields(fields, cap)
            except EventRejected as e:
                rejected.append(Rejected(entry_id, fields, e.reason, e.detail))
                continue
            accepted.append(Accepted(entry_id, event, fields[codec.ENTRY_FIELD]))
        return accepted, rejected

    def _store(self, shard: int, batch: Sequence[Accepted], retry: bool = True) -> None:
        """Append and acknowledge; a batch Postgres refuses is split to find the bad entry."""
        try:
            with metrics.BATCH_SECONDS.time():
                stored = self._log().append(shard, self.owned[shard], batch)
        except Fenced as e:
            log.warning("fenced: a newer owner wrote this shard", shard=shard, error=str(e))
            self._drop(shard)
            return
        except (Conflict, StorageRefused) as e:
            self._isolate(shard, batch, e, retry)
            return
        self.streams.ack(shard, [a.entry_id for a in batch])
        metrics.EVENTS.inc(stored)
        with self._lock:
            self.stored += stored

    def _isolate(
        self, shard: int, batch: Sequence[Accepted], error: Exception, retry: bool
    ) -> None:
        if retry and isinstance(error, Conflict):
            # Another writer overlapped (only possible around a lease hand-over): one
            # retry sees its rows and skips them.
            log.warning("concurrent writer, retrying batch", shard=shard, error=str(error))
            self._store(shard, batch, retry=False)
            return
        if len(batch) == 1:
            a = batch[0]
            rejected = Rejected(
                a.entry_id, {codec.ENTRY_FIELD: a.payload}, DATABASE_REFUSED, str(error)
            )
            self.streams.dead_letter(shard, [rejected])
            metrics.DEAD_LETTERS.labels(rejected.reason).inc()
            log.warning(
                "entry dead-lettered", shard=shard, entry_id=a.entry_id, reason=DATABASE_REFUSED
            )
            return
        half = len(batch) // 2
        self._store(shard, batch[:half])
        self._store(shard, batch[half:])

    # -- Postgres connection ----------------------------------------------------------------
    def _log(self) -> EventLog:
        """This thread's event log (one Postgres connection per thread)."""
        current: EventLog | None = getattr(self._local, "log", None)
        if current is None:
            current = self.open_log()
            self._local.log = current
            with self._lock:
                self._logs.append(current)
        return current

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.settings.ingest_threads, "ingest")
        return self._executor

    def _close_db(self) -> None:
        """Close every thread's connection; each reopens on its next batch."""
        with self._lock:
            logs, self._logs = self._logs, []
            self._local = threading.local()
        for event_log in logs:
            event_log.close()
