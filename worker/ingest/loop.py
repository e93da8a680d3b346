"""The ingest loop: shard streams -> the gate -> one Postgres transaction per batch -> XACK.

Invariants kept here (docs/architecture.md): an entry is acknowledged only after its
transaction commits; a shard has one owner at a time (`leases.py`: an expiring lease,
fenced in Postgres); bad entries go to the dead-letter stream (`gate.py` says which) and
never stop the loop; when Postgres or Redis goes away nothing is acknowledged, and the
loop backs off and carries on when it is back.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import redis
import structlog

from contextlog.schema import codec, signing
from contextlog.schema.errors import (
    Conflict,
    Fenced,
    ShardBusy,
    StorageRefused,
    Unavailable,
)
from contextlog.worker.app import metrics
from contextlog.worker.app.clock import Clock
from contextlog.worker.app.config import Settings
from contextlog.worker.ingest import attachments
from contextlog.worker.ingest.gate import Gate
from contextlog.worker.ingest.leases import Leases
from contextlog.worker.ingest.streams import (
    REDIS_AWAY,
    Entry,
    Rejected,
    Streams,
    id_key,
    is_full,
)
from contextlog.worker.store.eventlog import Accepted, EventLog

log = structlog.get_logger("contextlog.ingest")

EFFECTS_SWEEP_S = 10.0  # how often unsent effects are looked for
EFFECTS_GRACE_S = 30.0  # an effect this old was not sent by the batch that made it
DATABASE_REFUSED = "database_refused"


@dataclass
class Health:
    """Up/down state of each dependency, so an outage is logged once, not per retry, and
    noted where `contextlog status` reads it (`report`: what is down and since when; called
    on each change, with an empty dict once all is back)."""

    down: dict[str, str] = field(default_factory=dict)
    report: Callable[[dict[str, str]], object] = lambda down: None

    def failed(self, name: str, error: BaseException) -> None:
        """Record a failure; logs and reports only on the up -> down change."""
        changed = name not in self.down
        if changed:
            log.warning("dependency unavailable, retrying", dependency=name, error=str(error))
        self.down[name] = str(error)
        if changed:
            self.report(self.down)

    def ok(self) -> None:
        """Everything worked: log each dependency that came back."""
        if not self.down:
            return
        for name in list(self.down):
            log.info("dependency back", dependency=name)
            del self.down[name]
        self.report(self.down)


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
        signing_key: signing.Key | None = None,
    ) -> None:
        self.settings = settings
        self.gate = Gate(settings.max_entry_bytes, settings.max_deliveries, signing_key)
        self.streams = streams
        self.open_log = open_log
        self.clock = clock
        self.stop = stop or threading.Event()
        # Waiting between retries; a stop request cuts it short. Tests pass a fake.
        self.pause = pause or self.stop.wait
        self.health = Health(report=self._report)
        self._down_since: dict[str, int] = {}
        self.leases = Leases(settings, streams, clock, lambda: self._log().epochs())
        self._local = threading.local()  # each thread's EventLog
        self._logs: list[EventLog] = []
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._next_lease_check = 0.0
        self._next_sweep = 0.0
        self._next_trim = 0.0
        self._next_effects = 0.0
        self._sweep: Future[None] | None = None  # the effects sweep running, if any
        self._backoff = 0.0
        self.stored = 0
        self.retries = 0  # passes that failed on an outage, for tests and metrics
        self.crashes = 0  # passes that failed on anything else, survived in-process

    # -- lifecycle ----------------------------------------------------------------------
    def run(self) -> int:
        """Loop until `stop` is set; finish the batch in hand, release leases, return 0."""
        log.info("ingest started", consumer=self.streams.consumer, shards=self.settings.shards)
        try:
            self.streams.record_start(self._now_ms())
            self.streams.record_up()  # a note a killed namesake left is not ours
        except redis.RedisError as e:  # only a status note; the loop rides out the outage
            log.warning("could not record the start", error=str(e))
        while not self.stop.is_set():
            self.step()
        self.shutdown()
        log.info("ingest stopped", consumer=self.streams.consumer, stored=self.stored)
        return 0

    def step(self) -> None:
        """One pass: leases, recovery, one read and its batches, trimming; survive outages."""
        try:
            self.tick()
        except REDIS_AWAY as e:
            self._outage("redis", e)
        except Unavailable as e:
            self._close_db()
            self._outage("postgres", e)
        except Exception as e:
            if is_full(e):
                # Full, and what this pass needed takes memory (Redis 6 has no way around
                # it, see streams.ALLOW_OOM): an outage, not a crash, so nothing counts as
                # a delivery and nothing valid becomes poison while Redis is full.
                self._outage("redis", e)
                return
            # Deliberately broad: anything else is a bug or an entry our code cannot take.
            # Dying would only restart us on the same entries (and, under honcho, stop the
            # whole stack), so survive it the way a restart would: the entries in hand
            # are re-read as a new delivery, and the poison rule isolates a culprit.
            self._crashed(e)
        else:
            self._backoff = 0.0
            self.health.ok()

    def shutdown(self) -> None:
        """Let go of our shards so another process takes them at once."""
        try:
            for shard in list(self.leases.owned):
                self.streams.release(shard)
            self.streams.leave()
            self.streams.record_stop()
            self.streams.record_up()
        except redis.RedisError as e:
            log.warning("could not release leases", error=str(e))
        self.leases.owned.clear()
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None
        self._close_db()

    def _report(self, down: dict[str, str]) -> None:
        """Note for `status` what this process cannot reach (the first outage of a spell,
        since when), or take the note back. Best effort: a Redis that is away or full
        cannot take it, and `status` then sees Redis itself."""
        now_ms = self._now_ms()
        self._down_since = {n: self._down_since.get(n, now_ms) for n in down}
        try:
            if not down:
                self.streams.record_up()
                return
            name = next(iter(down))
            self.streams.record_down(name, self._down_since[name], down[name])
        except redis.RedisError as e:
            log.debug("outage note not written", error=str(e))

    def _outage(self, name: str, error: BaseException) -> None:
        self.health.failed(name, error)
        self.retries += 1
        self.leases.reread_all()  # what was read and not committed is pending with us
        self._back_off()

    def _crashed(self, error: Exception) -> None:
        log.error("ingest pass crashed, retrying the entries in hand", exc_info=error)
        self.crashes += 1
        self._close_db()
        # The note is for `status`; the retry below does not need it.
        with contextlib.suppress(redis.RedisError):
            self.streams.record_crash(self._now_ms(), f"{type(error).__name__}: {error}")
        self.leases.reread_all(delivered=True)  # as after a restart
        self._back_off()

    def _back_off(self) -> None:
        """Wait before the next pass, twice as long as last time, up to `backoff_max`."""
        self._backoff = min(self.settings.backoff_max, max(0.05, self._backoff * 2))
        self.pause(self._backoff)

    def _now_ms(self) -> int:
        return int(self.clock.now().timestamp() * 1000)

    # -- one pass -------------------------------------------------------------------------
    def tick(self) -> None:
        """Renew or rebalance leases when due, recover taken-over shards, then read."""
        now = self.clock.monotonic()
        if now >= self._next_lease_check:
            # Often (at least once a second), so a process that joins gets its share
            # of the shards quickly; renewing is two cheap pipelines.
            self.leases.rebalance()
            self._next_lease_check = now + min(1.0, self.settings.lease_seconds / 3)
        if now >= self._next_sweep:
            # Sweep for entries a former owner read after we took its shard over.
            self.leases.reread_all()
            self._next_sweep = now + self.settings.lease_seconds / 3
        for shard, taken in sorted(self.leases.recovering.items()):
            self.recover(shard, taken)
        if not self.leases.owned:
            self.pause(min(1.0, self.settings.lease_seconds / 3))
            return
        # A shard still to recover holds older entries than any new read: not read yet.
        shards = [s for s in sorted(self.leases.owned) if s not in self.leases.recovering]
        if not shards:
            return  # every shard busy: each recovery above already waited for its lock
        read, held = self._read(shards, self.settings.block_ms)
        work = [(s, e) for s, e in read.items() if s in self.leases.owned and e]
        if work:
            work = self._older_first(work, held)
        if len(work) > 1 and self.settings.ingest_threads > 1:
            self._drain_parallel(work)
        else:
            for shard, entries in work:
                self._drain(shard, entries)
        if self.settings.trim_seconds and now >= self._next_trim:
            for shard in list(self.leases.owned):
                self.streams.trim(shard)
            self._next_trim = now + self.settings.trim_seconds
        if now >= self._next_effects and (self._sweep is None or self._sweep.done()):
            # On a thread of the pool, with its own connection: the sweep's three round
            # trips held every shard's next batch (at 150-300 ms of latency, 1.4 s).
            self._next_effects = now + EFFECTS_SWEEP_S
            self._sweep = self._pool().submit(self._flush_effects)

    def _flush_effects(self) -> None:
        """Relay the effects a crash or a Redis outage left between commit and relay.
        A Redis that refuses them (full, or away) leaves them in Postgres for the next
        sweep: the drain, which frees Redis's memory, must not wait for them. (A Postgres
        outage shows again at the next batch, which handles it.)"""
        try:
            sent = self._log().flush_effects(older_than=EFFECTS_GRACE_S)
        except (redis.RedisError, Unavailable) as e:
            log.warning("effects not relayed, left for the next sweep", error=str(e))
            return
        except Exception as e:
            # Deliberately broad: it runs on the pool, where nothing would ever see what
            # ended it; the effects wait in Postgres for the next sweep.
            log.error("effects sweep failed, retrying at the next", exc_info=e)
            return
        if sent:
            log.info("effects relayed by the sweep", count=sent)

    def _drain_parallel(self, work: list[tuple[int, list[Entry]]]) -> None:
        """Store the shards' batches on the pool, refilling as they finish: a task stores
        a shard's batch and reads its next entries (`_drain_next`), which go to the back
        of the pool's queue at once, so with more shards than threads every shard takes
        its turn. Shards are independent: while one thread waits on Postgres or Redis
        (both release the GIL), another decodes and formats."""
        running = {self._pool().submit(self._drain_next, s, e): s for s, e in work}
        try:
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    shard = running.pop(f)
                    if entries := f.result():  # re-raises an outage here, in the loop's thread
                        running[self._pool().submit(self._drain_next, shard, entries)] = shard
        finally:
            wait(running)  # all done before an error closes the connections they use

    def _drain_next(self, shard: int, entries: Sequence[Entry]) -> list[Entry]:
        """`_drain` a shard's batch, then read its next entries (without blocking), in the
        task's thread: read by the loop's thread, the refills took ~17% of its time while
        the shards' threads waited (py-spy). Nothing when the lease check is due (the pass's
        upkeep runs between passes, with nothing in flight), when the shard is no longer
        ours or waits for recovery, and where another consumer holds entries of the shard
        (they are older than what we read: recovery stores them first, `_older_first`).
        Entries read and then not stored (the pass failed) stay pending with us, and are
        re-read first by the recovery that follows an outage or a crash."""
        self._drain(shard, entries)
        if (
            self.stop.is_set()
            or self.clock.monotonic() >= self._next_lease_check
            or shard not in self.leases.owned
            or shard in self.leases.recovering
        ):
            return []
        return self._refill(shard)

    def _refill(self, shard: int) -> list[Entry]:
        """The shard's next batch, without blocking: reads of up to `batch_size` entries
        while the stream has more and the batch holds fewer than `batch_bytes` bytes.
        Larger batches cost Postgres less an event (a commit, the projections' upserts
        once a batch); the bound in bytes keeps a batch of large entries small. Nothing
        where another consumer holds entries of the shard (see `_drain_next`)."""
        batch: list[Entry] = []
        size = 0
        while True:
            read, held = self._read([shard], None)
            if shard in held:
                self.leases.recovering.setdefault(shard, False)  # ours are re-read with theirs
                return []
            got = read.get(shard, [])
            batch += got
            size += sum(len(v) for _, fields in got for v in fields.values())
            if len(got) < self.settings.batch_size or size >= self.settings.batch_bytes:
                return batch if shard in self.leases.owned else []

    def _older_first(
        self, work: list[tuple[int, list[Entry]]], held: Sequence[int]
    ) -> list[tuple[int, list[Entry]]]:
        """Where a former owner still holds entries (`held`: seen just after our read),
        they are older than what we just read: recover the shard (ours and theirs, merged
        in stream order) instead."""
        late = [s for s, _ in work if s in held]
        for shard in late:
            log.warning("former owner holds entries, claiming them first", shard=shard)
            self.recover(shard, False)
        # A recovery can renew our leases and so lose some: those shards are not ours.
        return [(s, e) for s, e in work if s not in late and s in self.leases.owned]

    def _read(
        self, shards: Sequence[int], block_ms: int | None
    ) -> tuple[dict[int, list[Entry]], list[int]]:
        """New entries, and the shards where another consumer holds entries."""
        try:
            return self.streams.read_new_checked(shards, self.settings.batch_size, block_ms)
        except redis.ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
            # Redis lost its data (or someone deleted a stream): recreate and carry on.
            log.warning("consumer group missing, recreating", error=str(e))
            for shard in shards:
                self.streams.ensure_group(shard)
            return {}, []

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
        suspects = self.streams.inflight(shard) if taken else None
        entries = dict(own)
        entries.update(self.streams.claim_from_others(shard))
        ordered = sorted(entries.items(), key=lambda kv: id_key(kv[0]))
        counts = self.streams.deliveries(shard, [k for k, _ in ordered])
        marked = False
        for chunk in chunks(ordered, suspects, self.settings.batch_size):
            if not self.leases.keep(shard):
                return  # the marker stays: it is the new owner's to read
            try:
                marked |= self.process(shard, chunk, counts, suspects)
            except ShardBusy as e:
                self._busy(shard, e)  # the rest waits: nothing newer goes first
                return
        if marked:
            self.streams.mark_inflight(shard, None)
        self.leases.recovering.pop(shard, None)

    def _drain(self, shard: int, entries: Sequence[Entry]) -> None:
        """`process` newly read entries; if the shard is busy they wait, in order."""
        try:
            self.process(shard, entries)
        except ShardBusy as e:
            self._busy(shard, e)

    def _busy(self, shard: int, error: ShardBusy) -> None:
        """A stalled former writer still holds the shard's checkpoint lock: what we hold
        stays pending with us, and is re-read (not a new delivery) before anything newer,
        until Postgres ends that writer's transaction (`bound_waits`)."""
        log.warning("shard busy, retrying its entries in order", shard=shard, error=str(error))
        self.leases.recovering[shard] = False

    def process(
        self,
        shard: int,
        entries: Sequence[Entry],
        deliveries: dict[str, int] | None = None,
        suspects: tuple[str, str] | None = None,
    ) -> bool:
        """Dead-letter what is bad, append the rest in one transaction, then XACK.

        Redelivered entries (an ingest died or crashed with them in hand) are processed
        under an in-flight marker naming them, from decoding to the XACK, so that if they
        kill the process again the next owner knows which: those become `suspects` and
        are processed one at a time (`chunks`). Only an entry caught alone, delivered more
        than `max_deliveries` times, is dead-lettered as poison; valid entries that merely
        shared its batch are never condemned with it. Returns whether it marked.
        """
        deliveries = deliveries or {}
        marked = any(deliveries.get(entry_id, 1) > 1 for entry_id, _ in entries)
        if marked:
            self.streams.mark_inflight(shard, entries[0][0], entries[-1][0])
        accepted, rejected = self.gate.sort_out(entries, deliveries, suspects)
        full = None
        if rejected:
            try:
                self._dead_letter(shard, rejected)
            except redis.ResponseError as e:
                if not is_full(e):
                    raise
                full = e  # Redis 6, full: these wait for memory, the valid ones go on
        if accepted and attachments.any_refs(accepted):
            self._store_with_attachments(shard, accepted)
        elif accepted:
            self._store(shard, accepted)
        if full is not None:
            raise full
        return marked

    def _dead_letter(self, shard: int, rejected: list[Rejected]) -> None:
        self.streams.dead_letter(shard, rejected)
        for r in rejected:
            metrics.DEAD_LETTERS.labels(r.reason).inc()
        for r in rejected:
            log.warning("entry dead-lettered", shard=shard, entry_id=r.entry_id, reason=r.reason)

    def _store_with_attachments(self, shard: int, accepted: list[Accepted]) -> None:
        """In parts bounded in attachment bytes, each stored with the bytes it brings from
        Redis; an entry whose bytes are gone is dead-lettered (`worker.attachments`)."""
        for group in attachments.groups(accepted):
            ok, missing = attachments.resolve(self.streams.redis, self._log(), shard, group)
            if missing:
                self._dead_letter(shard, missing)
            if ok:
                self._store(shard, ok)

    def _store(self, shard: int, batch: Sequence[Accepted], retry: bool = True) -> None:
        """Append and acknowledge; a batch Postgres refuses is split to find the bad entry."""
        epoch = self.leases.owned.get(shard)
        if epoch is None:
            return  # the lease was lost meanwhile: the entries are the new owner's to claim
        try:
            with metrics.BATCH_SECONDS.time():
                stored = self._log().append(shard, epoch, batch)
        except Fenced as e:
            log.warning("fenced: a newer owner wrote this shard", shard=shard, error=str(e))
            self.leases.drop(shard)
            return
        except (Conflict, StorageRefused) as e:
            self._isolate(shard, batch, e, retry)
            return
        self.streams.ack(shard, [a.entry_id for a in batch])
        attachments.forget(self.streams.redis, shard, batch)
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
            self._dead_letter(shard, [rejected])
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


def chunks(
    ordered: Sequence[Entry], suspects: tuple[str, str] | None, size: int
) -> Iterator[list[Entry]]:
    """Batches of at most `size` in stream order, each suspect entry alone."""
    low, high = (id_key(suspects[0]), id_key(suspects[1])) if suspects else (None, None)
    run: list[Entry] = []
    for entry in ordered:
        if low is not None and high is not None and low <= id_key(entry[0]) <= high:
            if run:
                yield run
                run = []
            yield [entry]
            continue
        run.append(entry)
        if len(run) == size:
            yield run
            run = []
    if run:
        yield run
