"""What the API's handlers use, built once per `contextlog api` process by the composition
root (`bootstrap.build_api_services`) and handed to the app."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

from contextlog.producers.connection import AsyncClient
from contextlog.producers.producer import AsyncProducer, Producer
from contextlog.producers.reader import AsyncContextReader, ContextReader
from contextlog.worker.api.keys import Keys
from contextlog.worker.api.limits import RateLimiter
from contextlog.worker.app.clock import Clock
from contextlog.worker.app.config import Settings
from contextlog.worker.tasks.webhooks import Deliveries


@dataclass
class Services:
    """Clients and policies of one API process. The async reader and producer serve
    requests on the event loop; the sync ones serve export and import (an atomic MULTI
    and the archive code), which run in a worker thread."""

    settings: Settings
    reader: AsyncContextReader
    producer: AsyncProducer
    sync_reader: ContextReader
    sync_producer: Producer
    pool: AsyncConnectionPool[Any]  # keys, settings, webhooks
    redis: AsyncClient  # notifications, health
    keys: Keys
    limiter: RateLimiter
    clock: Clock
    deliveries: Deliveries  # webhook replays (blocking)

    async def open(self) -> None:
        """Open the pools (after any fork, inside the server's event loop)."""
        await self.pool.open(wait=False)

    async def close(self) -> None:
        """Close every client."""
        await self.pool.close()
        await self.reader.aclose()
        await self.producer.aclose()
        await self.redis.aclose()
        self.sync_reader.close()
        self.sync_producer.close()
        self.deliveries.queue.connection.close()
