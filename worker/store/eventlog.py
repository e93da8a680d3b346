"""Postgres side of ingest: the idempotent, fenced batch append (migrations.py makes the
schema, rows.py formats the rows, outbox.py sends what a batch asks for)."""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow

from contextlog.producers.commands import utcnow
from contextlog.producers.liveness import Watchdog
from contextlog.schema import codec
from contextlog.schema import events as ev
from contextlog.schema.defaults import ConversationDefaults
from contextlog.schema.errors import Conflict, Fenced, ShardBusy, StorageRefused, Unavailable
from contextlog.schema.queries import query
from contextlog.worker.effects.kinds import Arm, Compact, Effect
from contextlog.worker.effects.outbox import Outbox
from contextlog.worker.effects.relay import Relay
from contextlog.worker.store import attachments, projection
from contextlog.worker.store.batch import Accepted as Accepted  # the append's input
from contextlog.worker.store.batch import EventLog as EventLog
from contextlog.worker.store.handlers import BARRIERS, COMMANDS, handle
from contextlog.worker.store.locks import REBUILD_LOCK
from contextlog.worker.store.rows import CopyText, guard_key, insert_params, row_of, unique

# The event id guard: the partitioned table's constraint and its partitions' (a unique
# violation names the partition's), as migration 007 names them.
EVENT_ID_GUARD: Final = re.compile(r"events(_p\d+)?_event_id_key")

# The SQLSTATE of `contextlog_fence` (008): `advance_checkpoint` fails with it when a newer
# lease epoch wrote the shard, which rolls the batch back whole.
FENCED: Final = "CL001"
# The SQLSTATE of `contextlog_refs_logged` (017): an attachment the batch references was
# deleted (an erase, retention) after ingest found it stored: the batch is rolled back and
# its entries read again, which brings the bytes from Redis anew.
ATTACHMENT_GONE: Final = "CL002"


IDLE: Final = TransactionStatus.IDLE


# How long one call on the ingest connection (a batch's append, a sweep) may wait for
# Postgres before the connection is cut: a batch outliving its lease is fenced anyway.
DEADLINE_S: Final = 15.0

# A stalled writer (a frozen process, a paused VM) holds its batch's transaction, and so its
# shard's checkpoint lock, for as long as it is stalled. It must not outlive its lease:
IDLE_TRANSACTION_FLOOR_S: Final = 5.0  # the server ends it after max(lease, this)
# and its successor waits only briefly for that lock, so it keeps renewing its leases.
LOCK_WAIT_FRACTION: Final = 1 / 3


def bound_waits(conn: psycopg.Connection[TupleRow], lease_seconds: float) -> None:
    """Set the ingest connection's limits: Postgres ends a transaction left idle longer
    than the lease (its locks go with it), and a lock wait gives up after a third of the
    lease with `ShardBusy`, so no writer waits on a stalled one past its lease."""
    idle_ms = int(max(lease_seconds, IDLE_TRANSACTION_FLOOR_S) * 1000)
    lock_ms = max(50, int(lease_seconds * LOCK_WAIT_FRACTION * 1000))
    conn.execute(f"SET idle_in_transaction_session_timeout = {idle_ms}")
    conn.execute(f"SET lock_timeout = {lock_ms}")
    conn.commit()


class PostgresEventLog:
    """The `events` table and its per-shard checkpoint, written by one ingest connection."""

    def __init__(
        self,
        conn: psycopg.Connection[TupleRow],
        *,
        defaults: ConversationDefaults | None = None,
        relay: Relay | None = None,
        now: Callable[[], dt.datetime] = utcnow,
        watchdog: Watchdog | None = None,
        deadline_s: float = DEADLINE_S,
    ) -> None:
        self.conn = conn
        self.defaults = defaults or ConversationDefaults()
        self.outbox = Outbox(conn, relay)
        # The authoritative time of what a batch logs (`events.recorded_at`): ingest's
        # clock, read once a batch, never a producer's.
        self.now = now
        self.watchdog = watchdog or Watchdog()
        self.deadline_s = deadline_s

    @contextlib.contextmanager
    def _bounded(self) -> Iterator[None]:
        """Cut the connection if the block still runs after `deadline_s`: a Postgres
        that stopped answering (a half-open connection, a black hole) fails the call as
        `Unavailable` instead of holding ingest for ever."""
        due = time.monotonic() + self.deadline_s
        with self.watchdog.guard(self.conn.fileno(), due) as guard:
            try:
                yield
            except psycopg.OperationalError as e:
                if guard.cut:
                    raise Unavailable(
                        f"Postgres did not answer within {self.deadline_s:g}s ({e})"
                    ) from e
                raise

    def append(self, shard: int, epoch: int, batch: Sequence[Accepted]) -> int:
        """See `EventLog.append`."""
        try:
            with self._bounded():
                return self._append(shard, epoch, batch)
        except psycopg.errors.UniqueViolation as e:
            raise Conflict(f"shard {shard}: {e}") from e
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as e:
            raise StorageRefused(str(e)) from e
        except psycopg.errors.LockNotAvailable as e:
            # A lock on its checkpoint row (a stalled former writer) or on a table (a
            # `LOCK TABLE`, a migration): the server's message says which wait ended.
            raise ShardBusy(f"shard {shard}: a lock it needs is held elsewhere ({e})") from e
        except psycopg.OperationalError as e:
            raise Unavailable(f"Postgres: {e}") from e
        except psycopg.DatabaseError as e:
            if e.sqlstate == FENCED:
                raise Fenced(f"shard {shard}: epoch {epoch} is older than the last writer's") from e
            if e.sqlstate == ATTACHMENT_GONE:
                raise Unavailable(f"shard {shard}: {e.diag.message_primary}; reading again") from e
            raise

    def epochs(self) -> dict[int, int]:
        """See `EventLog.epochs`."""
        try:
            with self._bounded():
                rows = self.conn.execute("SELECT shard, epoch FROM shard_checkpoints").fetchall()
                self.conn.rollback()
        except psycopg.OperationalError as e:
            raise Unavailable(f"Postgres: {e}") from e
        return {int(shard): int(epoch) for shard, epoch in rows}

    def stored_attachments(self, hashes: Sequence[str]) -> set[str]:
        """See `EventLog.stored_attachments`."""
        try:
            with self._bounded():
                found = attachments.stored(self.conn, hashes)
                self.conn.rollback()
        except psycopg.OperationalError as e:
            raise Unavailable(f"Postgres: {e}") from e
        return found

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def _append(self, shard: int, epoch: int, batch: Sequence[Accepted]) -> int:
        # Optimistic: a batch of first deliveries rarely holds a stored event, so look
        # the ids up only after the unique index said one is there.
        try:
            return self._write(shard, epoch, batch, check_stored=False)
        except psycopg.errors.UniqueViolation as e:
            if not EVENT_ID_GUARD.fullmatch(e.diag.constraint_name or ""):
                raise
            return self._write(shard, epoch, batch, check_stored=True)

    def _write(self, shard: int, epoch: int, batch: Sequence[Accepted], check_stored: bool) -> int:
        distinct = unique(batch)
        # On the optimistic path every unique event is new, so the checkpoint's statement
        # counts them (after a redelivery, `count_checkpoint_events` counts the new ones).
        checkpoint = {
            "shard": shard,
            "epoch": epoch,
            "last_entry_id": batch[-1].entry_id,
            "events": 0 if check_stored else len(distinct),
            "rebuild_lock": REBUILD_LOCK,
        }
        if _one_statement(self.conn, distinct, check_stored):
            stored, effects, ids = self._write_one_statement(checkpoint, distinct)
        else:
            stored, effects, ids = self._write_copied(checkpoint, distinct, check_stored)
        self.outbox.send(effects, ids)
        return stored

    def _write_one_statement(
        self, checkpoint: dict[str, object], batch: list[Accepted]
    ) -> tuple[int, list[Effect], list[int]]:
        """A bot's turn (a batch of a message or two) as one statement, `contextlog_append`
        (012): the checkpoint, the projections and the rows, sent in autocommit mode, so
        it is its own transaction and one round trip, which is most of the time from post
        to visible. Any failure (the fence, a duplicate event id) rolls all of it back."""
        # Messages only, so one round (`projection.rounds`): the batch grouped by
        # conversation, the order COPY writes a round in (positions follow it).
        batch = next(projection.rounds(batch, _conversation, lambda a: False))
        at = self.now()
        rows = [row_of(a.event, at) for a in batch]
        convs, threads = projection.fold(rows)
        params = {
            **checkpoint,
            **insert_params(batch, rows),
            **projection.change_params(convs, threads, self.defaults),
        }
        self.conn.autocommit = True
        try:
            # Prepared at the connection's first append (a round trip of its own, once),
            # so each turn's Postgres binds it without parsing or planning its call.
            q = query("append_messages")
            answers = self.conn.execute(q, params, prepare=True).fetchall()
        finally:
            if self.conn.info.transaction_status == IDLE:
                self.conn.autocommit = False
        # A conversation's answer has no thread (nor a recorded time: no round of COPY
        # needs it).
        conversations = [
            (a, c, seq, idle, latest, at)
            for a, c, t, seq, idle, latest, _, _ in answers
            if t is None
        ]
        thread_answers = [
            (a, c, t, through, at, compact)
            for a, c, t, _, _, at, through, compact in answers
            if t is not None
        ]
        # Messages only: what they ask for (compactions, timer arms) is asked for again by
        # a later batch, so nothing had to be kept in the transaction (`outbox.keep`).
        after = _After(self.defaults)
        after.add(projection.answered(convs, conversations, thread_answers))
        return len(batch), after.effects(), []

    def _write_copied(
        self, checkpoint: dict[str, object], distinct: list[Accepted], check_stored: bool
    ) -> tuple[int, list[Effect], list[int]]:
        """Any other batch: COPY, commands, attachments, a redelivery. Returns how many
        events were new, the batch's effects and the ids of those kept."""
        with self.conn.transaction(), self.conn.cursor() as cur:
            # The checkpoint row goes first: its lock serialises two writers of a shard
            # and a fenced writer's statement fails, before anything else is written.
            cur.execute(query("advance_checkpoint"), checkpoint)
            fresh = distinct
            if check_stored:
                fresh = self._not_stored(cur, distinct)
                cur.execute(
                    query("count_checkpoint_events"),
                    {"shard": checkpoint["shard"], "events": len(fresh)},
                )
            # The bytes first: the events' references are checked against them (017).
            if any(a.blobs for a in fresh):
                attachments.insert(cur, fresh)
            effects = self._insert(cur, fresh) if fresh else []
            ids = self.outbox.keep(cur, effects)
        return len(fresh), effects, ids

    def flush_effects(self, older_than: float = 30.0, limit: int = 500) -> int:
        """See `EventLog.flush_effects`."""
        with self._bounded():
            return self.outbox.flush(older_than, limit)

    def _not_stored(self, cur: psycopg.Cursor[TupleRow], batch: list[Accepted]) -> list[Accepted]:
        """The events of `batch` not yet in the log (after a redelivery)."""
        keys = {
            "ids": [a.event.event_id for a in batch],
            "agents": [a.event.agent for a in batch],
            "channels": [a.event.channel for a in batch],
        }
        stored = {tuple(r) for r in cur.execute(query("existing_event_ids"), keys)}
        return [a for a in batch if guard_key(a.event) not in stored]

    def _insert(self, cur: psycopg.Cursor[TupleRow], fresh: list[Accepted]) -> list[Effect]:
        """Per round: fold the projections (reserving sequence numbers), COPY the rows,
        then apply the commands that end the round."""
        effects: list[Effect] = []
        after = _After(self.defaults)
        at = self.now()
        with_rows = [(a, row_of(a.event, at)) for a in fresh]
        for segment in projection.rounds(
            with_rows, _row_conversation, _row_is_command, _row_is_setting, _row_is_barrier
        ):
            rows = [row for _, row in segment]
            convs, threads = projection.fold(rows)
            applied = projection.apply(cur, convs, threads, self.defaults)
            copied = CopyText(applied.bases, applied.totals, applied.times)
            commands = []
            for a, row in segment:
                seq = copied.add(a, row)
                if row.kind in COMMANDS:
                    commands.append((a.event, seq, applied.times[(row.agent, row.channel)]))
            with cur.copy(query("copy_events")) as copy:
                copy.write(copied.text())
            compact = projection.segments(cur, convs, threads, self.defaults)
            after.add(applied._replace(to_compact=compact))
            for event, seq, logged in commands:
                effects += handle(cur, event, seq, logged, self.defaults)
        return effects + after.effects()


@dataclass
class _After:
    """What a batch's projections ask for once it has committed: compactions of windows
    past the threshold, and idle timers."""

    defaults: ConversationDefaults
    compact: set[tuple[str, str]] = field(default_factory=set)
    deadlines: dict[tuple[str, str], dt.datetime] = field(default_factory=dict)

    def add(self, applied: projection.Applied) -> None:
        """Take in one round's answers (a later round's deadline wins)."""
        self.compact.update(applied.to_compact)
        for key, timeout, activity in applied.active:
            timeout = self.defaults.idle_timeout if timeout is None else timeout
            if timeout > 0:
                # Clamped: a log written before times were bounded may hold a last
                # activity near year 9999, and the sum must not overflow.
                self.deadlines[key] = min(activity, codec.LATEST) + dt.timedelta(seconds=timeout)

    def effects(self) -> list[Effect]:
        """Compactions, then timer arms, each in conversation order."""
        compact: list[Effect] = [Compact(a, c) for a, c in sorted(self.compact)]
        return compact + [Arm(a, c, due) for (a, c), due in sorted(self.deadlines.items())]


# A batch this small, of messages only (no commands, attachments or redelivery), is
# written by one statement, its rows as parameters; a larger one is COPYed.
ONE_STATEMENT_MAX: Final = 64


def _one_statement(
    conn: psycopg.Connection[TupleRow], batch: Sequence[Accepted], check_stored: bool
) -> bool:
    return (
        not check_stored
        # A transaction left open on the connection (none is) would be nested: COPY then.
        and conn.info.transaction_status == IDLE
        and len(batch) <= ONE_STATEMENT_MAX
        # Commands and settings take rounds of their own (`_insert`).
        and not any(a.blobs or ev.kind_of(a.event) in _ROUNDS for a in batch)
    )


_ROUNDS: Final = COMMANDS | {projection.CONFIGURE}


def _conversation(a: Accepted) -> tuple[str, str]:
    return (a.event.agent, a.event.channel)


def _row_conversation(item: tuple[Accepted, projection.Row]) -> tuple[str, str]:
    return (item[1].agent, item[1].channel)


def _row_is_command(item: tuple[Accepted, projection.Row]) -> bool:
    return item[1].kind in COMMANDS


def _row_is_setting(item: tuple[Accepted, projection.Row]) -> bool:
    return item[1].kind == projection.CONFIGURE


def _row_is_barrier(item: tuple[Accepted, projection.Row]) -> bool:
    return item[1].kind in BARRIERS


class MemoryEventLog:
    """An in-memory `EventLog` with the same rules: for unit tests and the contract suite."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, Accepted]] = []  # (seq, accepted) in commit order
        self.ids: set[tuple[uuid.UUID, str, str]] = set()  # `guard_key`s
        self.last_seq: Counter[tuple[str, str]] = Counter()
        self.checkpoints: dict[int, tuple[int, str]] = {}  # shard -> (epoch, last entry id)
        self.refuse: set[uuid.UUID] = set()  # event ids to refuse, as a database might
        self.attachments: dict[str, bytes] = {}

    def append(self, shard: int, epoch: int, batch: Sequence[Accepted]) -> int:
        """See `EventLog.append`."""
        if self.checkpoints.get(shard, (0, ""))[0] > epoch:
            raise Fenced(f"shard {shard}: epoch {epoch} is older than the last writer's")
        if any(a.event.event_id in self.refuse for a in batch):
            raise StorageRefused("refused by the fake")
        fresh = [a for a in unique(batch) if guard_key(a.event) not in self.ids]
        for a in fresh:
            self.attachments.update(a.blobs)
            self.ids.add(guard_key(a.event))
            key = (a.event.agent, a.event.channel)
            self.last_seq[key] += 1
            self.rows.append((self.last_seq[key], a))
        self.checkpoints[shard] = (epoch, batch[-1].entry_id)
        return len(fresh)

    def epochs(self) -> dict[int, int]:
        """See `EventLog.epochs`."""
        return {shard: cp[0] for shard, cp in self.checkpoints.items()}

    def flush_effects(self, older_than: float = 30.0, limit: int = 500) -> int:
        """The fake keeps no effects."""
        return 0

    def stored_attachments(self, hashes: Sequence[str]) -> set[str]:
        """See `EventLog.stored_attachments`."""
        return {h for h in hashes if h in self.attachments}

    def close(self) -> None:
        """Nothing to release."""
