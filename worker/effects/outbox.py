"""The effects outbox: notices, summary jobs and idle timers that a batch asks for.

They are kept in the batch's transaction (`effects` table), sent after it commits, then
deleted; what a crash or an outage leaves behind is sent by the sweep (`flush`). Compaction
triggers and timer arms are not kept: the next batch of the conversation asks again.
"""

from __future__ import annotations

import psycopg
import redis
import structlog
from psycopg.rows import TupleRow

from contextlog.schema.errors import Unavailable
from contextlog.schema.queries import query
from contextlog.worker.effects import kinds as fx
from contextlog.worker.effects.kinds import Effect
from contextlog.worker.effects.relay import Relay

log = structlog.get_logger("contextlog.outbox")


class Outbox:
    """The `effects` table of one ingest connection, and where committed effects go."""

    def __init__(self, conn: psycopg.Connection[TupleRow], relay: Relay | None) -> None:
        self.conn = conn
        # Without a relay, effects wait in the table (tests, `contextlog rebuild`).
        self.relay = relay

    def keep(self, cur: psycopg.Cursor[TupleRow], effects: list[Effect]) -> list[int]:
        """In the batch's transaction: store the effects a crash must not lose; their ids."""
        durable = fx.durable(effects)
        if not durable:
            return []
        rows = fx.to_rows(durable)
        kept = cur.execute(query("insert_effects"), {"rows": rows.decode()})
        return [int(effect_id) for (effect_id,) in kept]

    def send(self, effects: list[Effect], ids: list[int]) -> None:
        """After commit: send a batch's effects, then forget the kept ones; on failure the
        sweep (`flush`) sends them later."""
        if not effects or self.relay is None:
            return
        try:
            self.relay.send(effects)
            if ids:
                with self.conn.transaction():
                    self.conn.execute(query("delete_effects"), {"ids": ids})
        except (Unavailable, redis.RedisError, psycopg.Error) as e:
            log.warning("effects not sent, left for the sweep", error=str(e), count=len(ids))

    def flush(self, older_than: float = 30.0, limit: int = 500) -> int:
        """Send effects a crash or outage left behind; returns how many were sent."""
        if self.relay is None:
            return 0
        try:
            with self.conn.transaction():
                params = {"older_than": older_than, "limit": limit}
                rows = self.conn.execute(query("take_effects"), params).fetchall()
                if rows:
                    self.relay.send([fx.from_row(kind, body) for _effect_id, kind, body in rows])
                    ids = [effect_id for effect_id, _kind, _body in rows]
                    self.conn.execute(query("delete_effects"), {"ids": ids})
        except psycopg.OperationalError as e:
            raise Unavailable(f"Postgres: {e}") from e
        return len(rows)
