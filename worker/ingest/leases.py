"""The shards one ingest process owns: expiring leases in Redis, fenced in Postgres.

Each process keeps its fair share (shards / live members, rounded up): it renews its
leases, gives back extras when another process joins, and takes free shards, starting at
a point derived from its name so that processes spread out. A lease's epoch is above
every epoch Postgres has seen for its shard (`epochs`), so a stalled former owner can
never commit after its successor (docs/architecture.md, invariant 2). A shard just taken
is recovered before anything newer is read (`recovering`).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import structlog

from contextlog.worker.app.clock import Clock
from contextlog.worker.app.config import Settings
from contextlog.worker.ingest.streams import Streams

log = structlog.get_logger("contextlog.ingest")


class Leases:
    """Our shards, their epochs, and those to recover before new entries are read."""

    def __init__(
        self,
        settings: Settings,
        streams: Streams,
        clock: Clock,
        epochs: Callable[[], dict[int, int]],
    ) -> None:
        self.settings = settings
        self.streams = streams
        self.clock = clock
        self.epochs = epochs  # the highest epoch Postgres saw per shard
        self.owned: dict[int, int] = {}  # shard -> lease epoch
        # Shards to recover before reading new entries; True when we just took the lease
        # (what is pending was in flight when its reader died: a new delivery).
        self.recovering: dict[int, bool] = {}
        self._next_renew = 0.0

    @property
    def ttl_ms(self) -> int:
        return int(self.settings.lease_seconds * 1000)

    def rebalance(self) -> None:
        """Keep our fair share of shards: renew, give back extras, take free ones."""
        now_ms = int(self.clock.now().timestamp() * 1000)
        members = self.streams.heartbeat(now_ms, self.ttl_ms)
        fair = math.ceil(self.settings.shards / max(1, members))
        self.renew()
        for shard in sorted(self.owned, reverse=True)[: max(0, len(self.owned) - fair)]:
            self.streams.release(shard)
            self.drop(shard)
            log.info("lease given back for balance", shard=shard)
        if len(self.owned) < fair:
            self._take(fair)

    def _take(self, fair: int) -> None:
        floors = self.epochs()
        start = zlib.crc32(self.streams.consumer.encode()) % self.settings.shards
        for i in range(self.settings.shards):
            shard = (start + i) % self.settings.shards
            if len(self.owned) >= fair:
                return
            if shard in self.owned:
                continue
            epoch = self.streams.acquire(shard, self.ttl_ms, floors.get(shard, 0))
            if epoch is not None:
                self.streams.ensure_group(shard)
                self.owned[shard] = epoch
                self.recovering[shard] = True
                log.info("lease taken", shard=shard, epoch=epoch)

    def renew(self) -> None:
        """Renew every lease we hold; those Redis no longer gives us are dropped."""
        for shard in self.streams.renew(sorted(self.owned), self.ttl_ms):
            log.warning("lease lost", shard=shard)
            self.drop(shard)
        self._next_renew = self.clock.monotonic() + self.settings.lease_seconds / 3

    def keep(self, shard: int) -> bool:
        """Renew our leases when due, also deep inside a long recovery: a lease lost
        half-way would let a successor store newer entries before the rest of ours."""
        if self.clock.monotonic() >= self._next_renew:
            self.renew()
        return shard in self.owned

    def reread_all(self, delivered: bool = False) -> None:
        """Every shard we own is recovered before new entries are read: what we read and
        did not commit, and what a former owner read after we took over, are read again
        first. `delivered`: as after a restart (re-reading counts a delivery, and the
        in-flight marker names the suspects)."""
        for shard in self.owned:
            if delivered:
                self.recovering[shard] = True
            else:
                self.recovering.setdefault(shard, False)

    def drop(self, shard: int) -> None:
        """The shard is not ours any more (lost, fenced or given back)."""
        self.owned.pop(shard, None)
        self.recovering.pop(shard, None)
