"""Read models for adapters: the rolling-window context of a conversation, from Postgres."""

from __future__ import annotations

import datetime as dt
import functools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from typing import Any, Final, ParamSpec, TypeVar

import msgspec
import psycopg
import psycopg.types.json
from psycopg.rows import class_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from contextlog.producers import attachments, liveness
from contextlog.producers import search as found
from contextlog.producers.context import (
    Context,
    Frame,
    Segment,
    StoredMessage,
    SystemMessages,
    build_context,
)
from contextlog.producers.history import (
    FOUND,
    LISTED,
    MESSAGES,
    PER_PAGE,
    SessionInfo,
    SessionMessage,
    SessionPage,
    page_params,
    pick,
    to_page,
)
from contextlog.producers.replica import (
    MAX_LAG,
    WAIT,
    ASend,
    AsyncReplica,
    Policy,
    Replica,
    Send,
    Timer,
    afetch_sent,
    fetch_sent,
)
from contextlog.producers.tails import CONTENT, NO_HINT, SEQ, STATE_SEQ, Row, Tail, Tails
from contextlog.schema import codec
from contextlog.schema.defaults import ConversationDefaults
from contextlog.schema.errors import NotVisible, Unavailable, one_line
from contextlog.schema.queries import query

T = TypeVar("T")
# What a read of a thread returns: its segment's state (None: no messages yet) and rows.
Parts = tuple[dict[str, Any] | None, list[Row]]
_content = msgspec.json.Decoder()  # a row's content, sent as JSON text


def stored(rows: Sequence[Row]) -> list[StoredMessage]:
    """Message rows (seq, tokens, role, content as JSON text, ...) as messages, decoded
    afresh: no two reads share a block."""
    return [StoredMessage(r[0], r[2], _content.decode(r[3]), r[1]) for r in rows]


def segment_of(state: dict[str, Any]) -> Segment:
    """A segment's state as `segment_messages` sends it."""
    at = state.get("seg_at")
    return Segment(
        boundaries=int(state["boundaries"]),
        start=int(state["seg_start"]),
        strip_through=int(state["strip_through"]),
        note=state.get("note"),
        summary=state.get("summary"),
        threads=tuple(state.get("threads") or ()),
        block=state.get("block"),
        boundary=state.get("boundary"),
        boundary_seq=state.get("boundary_seq"),
        budget=int(state["budget"]),
        start_at=dt.datetime.fromisoformat(at) if at else None,
    )


def frame_of(state: dict[str, Any]) -> Frame | None:
    """The bot's registered frame, if any."""
    frame = state.get("frame")
    if not frame:
        return None
    return Frame(frame["model"], frame.get("system"), frame.get("tools"), frame.get("thinking"))


@dataclass(frozen=True)
class SegmentRead:
    """A thread's context with what it was built from: for a compaction job."""

    context: Context
    messages: list[StoredMessage]
    segment: Segment | None


def assemble(parts: Parts, system_messages: SystemMessages = "keep") -> Context:
    """The context of a thread from what its read returned."""
    state, rows = parts
    if state is None:
        return build_context([], None, system_messages=system_messages)
    return build_context(
        stored(rows),
        segment_of(state),
        system_messages=system_messages,
        frame=frame_of(state),
        last_seq=int(state["last_seq"]),
    )


def _segment_read(parts: Parts, system_messages: SystemMessages) -> SegmentRead:
    state, rows = parts
    segment = None if state is None else segment_of(state)
    return SegmentRead(assemble(parts, system_messages), stored(rows), segment)


# psycopg prepares a statement run 5 times; a generic plan serves every read (the query
# fixes its own plan's shape: OFFSET 0, the range as subqueries).
_ONE_PLAN = "SET plan_cache_mode = force_generic_plan"


def _configure(conn: Any) -> None:
    # jsonb content decoded by msgspec: several times faster than the json module.
    psycopg.types.json.set_json_loads(msgspec.json.decode, conn)
    conn.execute(_ONE_PLAN)


def _not_visible(event_id: str, timeout: float) -> NotVisible:
    return NotVisible(
        f"event {event_id} was not stored within {timeout}s: is `contextlog ingest` running?"
    )


def _cut_short(event_id: str, timeout: float, error: psycopg.Error) -> NotVisible:
    return NotVisible(
        f"the wait for event {event_id} was cancelled before its {timeout}s ({error}): "
        "Postgres waits for it, so a `statement_timeout` below the wait's timeout ends it"
    )


# A call with a `timeout` returns or raises within timeout + WAIT_MARGIN_S, whatever the
# server does (a black hole, a lock, latency): Postgres waits for the event until
# WAIT_MARGIN_S before the deadline, which leaves its answer a round trip to come back,
# and at the deadline the watchdog cuts the connection (`liveness.Watchdog`).
WAIT_MARGIN_S: Final = 1.0
READ_TIMEOUT_S: Final = 10.0  # the same bound for the reads without a timeout (sessions)
# A connection taken without a deadline (`connection()`: the worker's sweeps and jobs,
# export) is cut after this: one query over every conversation may take a while.
CONNECTION_TIMEOUT_S: Final = 60.0


def _deadline(timeout: float) -> float:
    return time.monotonic() + timeout + WAIT_MARGIN_S


def _wait_budget(deadline: float) -> float:
    """How long Postgres may wait for an event: until WAIT_MARGIN_S before `deadline`."""
    return max(0.0, deadline - WAIT_MARGIN_S - time.monotonic())


def _no_answer(error: BaseException) -> Unavailable:
    return Unavailable(
        f"Postgres did not answer in time (the call's timeout + {WAIT_MARGIN_S:g}s): the "
        f"connection was closed ({error})"
    )


class _Lost(Unavailable):
    """A pooled connection turned out to be broken (reset, closed while it sat idle in
    the pool): the request may never have reached Postgres."""


def _lost(error: BaseException) -> Unavailable:
    return _Lost(f"Postgres: {one_line(error)}")


R = TypeVar("R")
P = ParamSpec("P")


def _once_more(read: Callable[P, R]) -> Callable[P, R]:
    """Run a read again, on another connection, when its pooled one was broken (every
    idle connection after a reset or a restart of Postgres, each found only when used):
    within what is left of its `timeout`, so the bound holds. Reads change nothing."""

    @functools.wraps(read)
    def again(*args: P.args, **kwargs: P.kwargs) -> R:
        started = time.monotonic()
        try:
            return read(*args, **kwargs)
        except _Lost:
            if (left := _left(kwargs, started)) <= 0:
                raise
            return read(*args, **{**kwargs, "timeout": left})  # type: ignore[arg-type]

    return again


def _once_more_async(read: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """`_once_more`, for asyncio."""

    @functools.wraps(read)
    async def again(*args: P.args, **kwargs: P.kwargs) -> R:
        started = time.monotonic()
        try:
            return await read(*args, **kwargs)
        except _Lost:
            if (left := _left(kwargs, started)) <= 0:
                raise
            return await read(*args, **{**kwargs, "timeout": left})  # type: ignore[arg-type]

    return again


def _left(kwargs: dict[str, Any], started: float) -> float:
    """What is left of a read's `timeout` (2 s by default) since `started`."""
    return float(kwargs.get("timeout", 2.0)) - (time.monotonic() - started)


def _no_connection(error: BaseException) -> Unavailable:
    return Unavailable(f"Postgres: no connection in time ({error})")


def read_params(
    agent: str, channel: str, thread: str | None, defaults: ConversationDefaults
) -> dict[str, Any]:
    """Parameters of `segment_messages`, without a hint (`Tails.hint` adds one)."""
    codec.check_names(agent=agent, channel=channel, thread=thread)
    return {
        "agent": agent,
        "channel": channel,
        "thread": thread or "",
        "default_budget": defaults.token_budget,
        **NO_HINT,
    }


def _parts(rows: list[Row], tail: Tail | None) -> Parts | None:
    """The state and all rows of a segment from a read's answer (`tail`: the last read,
    which a hinted read goes on from); None when the hint was stale."""
    if not rows or rows[0][SEQ] != STATE_SEQ:
        return None if tail is not None else (None, [])
    state = _content.decode(rows[0][CONTENT])
    return state, [*(tail.rows if tail else ()), *rows[1:]]


class ThreadRead:
    """One context read of a thread: from the reader's last read of it while the thread
    crossed no boundary since (`Tails`), the whole segment otherwise; what it returned is
    learned when it is collected."""

    def __init__(self, tails: Tails, params: dict[str, Any]) -> None:
        self.tails = tails
        self.params = params  # without a hint

    def send(self, conn: Any) -> Callable[[], Parts]:
        """Queue the read (on a connection in pipeline mode, it travels with whatever
        else is queued); returns how to collect it."""
        params, tail = self.tails.hint(self.params)
        cur = conn.cursor().execute(query("segment_messages"), params)

        def collect() -> Parts:
            got = _parts(cur.fetchall(), tail)
            if got is None:  # a boundary since the last read: the segment afresh
                fresh = conn.execute(query("segment_messages"), self.params).fetchall()
                got = _parts(fresh, None)
                assert got is not None
            return self._learned(got)

        return collect

    def fetch(self, conn: Any) -> Parts:
        """The thread's segment and rows: one round trip (a second one only when the
        thread crossed a boundary since the last read)."""
        return fetch_sent(conn, self.send)

    async def asend(self, conn: Any) -> Callable[[], Awaitable[Parts]]:
        """`send` on an asyncio connection."""
        params, tail = self.tails.hint(self.params)
        cur = await conn.cursor().execute(query("segment_messages"), params)

        async def collect() -> Parts:
            got = _parts(await cur.fetchall(), tail)
            if got is None:
                fresh = await conn.execute(query("segment_messages"), self.params)
                got = _parts(await fresh.fetchall(), None)
                assert got is not None
            return self._learned(got)

        return collect

    async def afetch(self, conn: Any) -> Parts:
        """`fetch` on an asyncio connection."""
        return await afetch_sent(conn, self.asend)

    def _learned(self, parts: Parts) -> Parts:
        state, rows = parts
        if state is not None:
            self.tails.learn(self.params, state, rows)
        return parts


def _policy(max_replica_lag: float, replica_wait: float) -> Policy:
    return Policy(max_lag=max_replica_lag, wait=replica_wait)


class _Reader:
    def __init__(
        self,
        *,
        defaults: ConversationDefaults | None = None,
        system_messages: SystemMessages = "keep",
    ) -> None:
        # The reader's one look at the environment: deployment-wide setting defaults.
        self.defaults = defaults or ConversationDefaults.from_env(os.environ)
        # "fold": system messages as text in the user turn they follow, for models and
        # platforms that refuse the role in `messages` (docs/context.md).
        self.system_messages: SystemMessages = system_messages
        self.attachments = attachments.Cache()  # base64 of recently read attachments
        self.tails = Tails()  # where each thread's last read started
        self.replica: Replica | AsyncReplica | None = None
        self.watchdog = liveness.Watchdog()  # cuts a call still running at its deadline

    @property
    def routing(self) -> dict[str, int]:
        """Reads served by the primary and by the replica, and the primary's fallbacks by
        reason (lagging, behind, down, error); empty without a replica."""
        return {} if self.replica is None else self.replica.routing.snapshot()

    def _thread_read(self, agent: str, channel: str, thread: str | None) -> ThreadRead:
        return ThreadRead(self.tails, read_params(agent, channel, thread, self.defaults))

    def _context(self, parts: Parts, system_messages: SystemMessages | None) -> Context:
        return assemble(parts, system_messages or self.system_messages)


# Connections are opened on first use (never at import or construction time).
_POOL: dict[str, Any] = {
    "min_size": 1,
    "max_size": 4,
    "open": False,
}


def _pool_options(url: str) -> dict[str, Any]:
    """A pool's options: keepalives and a connect timeout on each connection (`liveness`)."""
    return {**_POOL, "kwargs": {"autocommit": True, **liveness.postgres_options(url)}}


class ContextReader(_Reader):
    """Synchronous reader: `r.context(agent, channel)` before every LLM turn."""

    def __init__(
        self, pool: ConnectionPool[Any], *, replica: Replica | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.pool = pool
        self.replica: Replica | None = replica

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        replica_url: str | None = None,
        max_replica_lag: float = MAX_LAG,
        replica_wait: float = WAIT,
        timer: Timer | None = None,
        **kwargs: Any,
    ) -> ContextReader:
        """A reader on the Postgres at `url`, reading from the streaming replica at
        `replica_url` when given (see `producers.replica`); connects on first use."""
        replica = None
        if replica_url:
            policy = _policy(max_replica_lag, replica_wait)
            pool = ConnectionPool(replica_url, configure=_configure, **_pool_options(replica_url))
            replica = Replica(pool, policy, timer)
        primary = ConnectionPool(url, configure=_configure, **_pool_options(url))
        return cls(primary, replica=replica, **kwargs)

    def connection(self, deadline: float | None = None) -> Any:
        """A pooled connection (a context manager); the pool opens on first use. With a
        `deadline` (`time.monotonic()`), getting the connection and using it end by then:
        `Unavailable` when Postgres has not answered."""
        deadline = deadline or _deadline(CONNECTION_TIMEOUT_S)
        if self.pool.closed:
            # Not `wait=True`: a pool whose first connections time out closes for good,
            # and the reader never recovered from a Postgres down at its first read. The
            # wait for a connection is `_guarded`'s, bounded by the deadline.
            self.pool.open(wait=False)
        return self._guarded(deadline)

    @contextmanager
    def _guarded(self, deadline: float) -> Iterator[Any]:
        wait = max(0.0, deadline - time.monotonic())
        try:
            with (
                self.pool.connection(timeout=wait) as conn,
                self.watchdog.guard(conn.fileno(), deadline) as guard,
            ):
                try:
                    yield conn
                except psycopg.OperationalError as e:  # the connection, not the request
                    raise _no_answer(e) if guard.cut else _lost(e) from e
                finally:
                    if guard.cut:
                        conn.close()  # cut: the pool must not hand it out again
        except PoolTimeout as e:
            raise _no_connection(e) from e

    @_once_more
    def context(
        self,
        agent: str,
        channel: str,
        thread: str | None = None,
        *,
        wait_for: str | None = None,
        timeout: float = 2.0,
        system_messages: SystemMessages | None = None,
    ) -> Context:
        """The context of one thread (or the main line), valid for the Messages API;
        `wait_for`: an event id it must include (waiting up to `timeout` seconds for
        ingest to store it); `system_messages`: the reader's setting for this read.
        Returns or raises within `timeout` + WAIT_MARGIN_S, whatever Postgres does."""
        deadline = _deadline(timeout)
        read = self._thread_read(agent, channel, thread)

        def connect() -> Any:
            return self.connection(deadline)

        if self.replica is None:
            with connect() as conn:
                if wait_for is None:
                    parts = read.fetch(conn)
                else:  # the reads ride with the looks for the event
                    waited = self._wait(
                        conn, wait_for, timeout, agent, channel, read.send, deadline=deadline
                    )
                    assert waited[1] is not None
                    parts = waited[1]
            ctx = self._context(parts, system_messages)
            return attachments.attach(connect, ctx, self.attachments)
        lsn = None
        if wait_for is not None:  # on the primary: a standby cannot LISTEN
            with connect() as conn:
                look = "await_event_at"
                lsn = self._wait(conn, wait_for, timeout, agent, channel, None, look, deadline)[0]
        got = self.replica.read(read.send, lsn, connect)
        ctx = replace(self._context(got.value, system_messages), served_by=got.by)
        return attachments.attach(got.connect, ctx, self.attachments)

    def segment(self, agent: str, channel: str, thread: str | None = None) -> SegmentRead:
        """A thread's context with its stored messages and segment, from the primary."""
        read = self._thread_read(agent, channel, thread)
        with self.connection() as conn:
            parts = read.fetch(conn)
        return _segment_read(parts, self.system_messages)

    def sessions(
        self, agent: str, channel: str | None = None, *, page: int = 1, per_page: int = PER_PAGE
    ) -> SessionPage:
        """Saved sessions of a conversation (or of all the agent's channels), newest first."""
        params = page_params(agent, channel, page, per_page)
        rows = self._read(lambda conn: _send_rows(conn, "list_sessions", params, LISTED))
        return to_page(rows, page, per_page)

    def session(
        self, session_id: str, *, agent: str | None = None, channel: str | None = None
    ) -> SessionInfo:
        """One live session; `Refused` ("there is no session") if unknown, deleted, or of
        another conversation than the one named."""
        return self._session(session_id, agent, channel)[0]

    def session_messages(
        self, session_id: str, *, agent: str | None = None, channel: str | None = None
    ) -> tuple[SessionInfo, list[SessionMessage]]:
        """A session and its messages, oldest first (what export writes)."""
        info, seqs = self._session(session_id, agent, channel)
        params = {"agent": info.agent, "channel": info.channel, "seqs": seqs}
        rows = self._read(lambda conn: _send_rows(conn, "session_messages", params, MESSAGES))
        return info, rows

    def search(
        self,
        agent: str,
        query: str,
        *,
        channel: str | None = None,
        thread: str | None = None,
        sender: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        page: int = 1,
        per_page: int = found.PER_PAGE,
    ) -> found.SearchPage:
        """The messages of `agent`'s log that match `query` (syntax: `schema.search`),
        best first, newest first among equals, one page; outside the window and in deleted
        sessions too (the log keeps them). Never another agent's. Bad input: `Refused`."""
        scope = found.Scope(channel, thread, sender, since, until)
        params = found.params(agent, query, scope, page, per_page)
        rows = self._read(lambda conn: _send_hits(conn, params))
        details: list[found.DetailRow] = []
        if hits := found.hits_of(rows):
            more = found.details_params(params, hits)
            details = self._read(lambda conn: _send_details(conn, more))
        return found.to_page(query, rows, details, page, per_page)

    def _session(
        self, session_id: str, agent: str | None, channel: str | None
    ) -> tuple[SessionInfo, list[int]]:
        params = {"session_id": session_id, "agent": agent, "channel": channel}
        rows = self._read(lambda conn: _send_rows(conn, "get_session", params, FOUND))
        return pick(rows, session_id, agent, channel)

    def _read(self, send: Send[T]) -> T:
        """The read `send` queues (`replica.fetch_sent`), on the replica (within its lag
        bound) or else the primary."""
        if self.replica is None:
            with self.connection(_deadline(READ_TIMEOUT_S)) as conn:
                return fetch_sent(conn, send)
        return self.replica.read(send, None, self.connection).value

    def _wait(
        self,
        conn: Any,
        event_id: str,
        timeout: float,
        agent: str,
        channel: str,
        then: Callable[[Any], Callable[[], T]] | None = None,
        look: str = "await_event",
        deadline: float | None = None,
    ) -> tuple[Any, T | None]:
        """Until `event_id` is stored: Postgres waits (`contextlog_await_event`, 010),
        woken by ingest's commit notification. Returns the first column of the `look`
        query's row (see `await_event_at`) and what `then` collected: `then(conn)` sends
        the reads that follow, queued behind the wait, so they run as soon as the event
        commits, in the same round trip; with the thread's known rows (`Tails`) they
        fetch what changed. With a `deadline`, Postgres waits until WAIT_MARGIN_S before it."""
        wait = timeout if deadline is None else _wait_budget(deadline)  # Postgres waits this long
        params = {"event_id": event_id, "agent": agent, "channel": channel, "timeout": wait}
        listening = True
        try:
            try:
                with conn.pipeline() as pipeline:
                    # A LISTEN takes effect when its transaction commits, and a pipeline's
                    # statements share one up to a sync: synced before the wait, it is in
                    # effect when the wait begins, and costs no round trip of its own
                    # (one of the three a read took; at 150-300 ms of latency, a second).
                    conn.execute(query("listen_commits"))
                    pipeline.sync()
                    waited = conn.execute(query(look), params)
                    conn.execute(query("unlisten_commits"))
                    collect = then(conn) if then else None
            except psycopg.errors.QueryCanceled as e:
                raise _cut_short(event_id, timeout, e) from e
            listening = False
            if (row := waited.fetchone()) is None:
                raise _not_visible(event_id, timeout)
            return row[0], (collect() if collect else None)
        finally:
            if listening:  # the pooled connection must not keep receiving them
                conn.execute(query("unlisten_commits"))

    def close(self) -> None:
        """Close the pools."""
        self.pool.close()
        if self.replica is not None:
            self.replica.close()


class AsyncContextReader(_Reader):
    """asyncio reader: `await r.context(agent, channel)`."""

    def __init__(
        self, pool: AsyncConnectionPool[Any], *, replica: AsyncReplica | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.pool = pool
        self.replica: AsyncReplica | None = replica

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        replica_url: str | None = None,
        max_replica_lag: float = MAX_LAG,
        replica_wait: float = WAIT,
        timer: Timer | None = None,
        **kwargs: Any,
    ) -> AsyncContextReader:
        """`ContextReader.from_url`, for asyncio."""
        replica = None
        if replica_url:
            policy = _policy(max_replica_lag, replica_wait)
            options = _pool_options(replica_url)
            pool = AsyncConnectionPool(replica_url, configure=_aconfigure, **options)
            replica = AsyncReplica(pool, policy, timer)
        primary = AsyncConnectionPool(url, configure=_aconfigure, **_pool_options(url))
        return cls(primary, replica=replica, **kwargs)

    @_once_more_async
    async def context(
        self,
        agent: str,
        channel: str,
        thread: str | None = None,
        *,
        wait_for: str | None = None,
        timeout: float = 2.0,
        system_messages: SystemMessages | None = None,
    ) -> Context:
        """`ContextReader.context`, for asyncio."""
        deadline = _deadline(timeout)
        read = self._thread_read(agent, channel, thread)

        async def connect() -> Any:
            return await self._aconn(deadline)

        if self.replica is None:
            async with await connect() as conn:
                if wait_for is None:
                    parts = await read.afetch(conn)
                else:  # the reads ride with the looks for the event
                    waited = await self._wait(
                        conn, wait_for, timeout, agent, channel, read.asend, deadline=deadline
                    )
                    assert waited[1] is not None
                    parts = waited[1]
            ctx = self._context(parts, system_messages)
            return await attachments.aattach(connect, ctx, self.attachments)
        lsn = None
        if wait_for is not None:  # on the primary: a standby cannot LISTEN
            async with await connect() as conn:
                look = "await_event_at"
                waited = await self._wait(
                    conn, wait_for, timeout, agent, channel, None, look, deadline
                )
                lsn = waited[0]
        got = await self.replica.read(read.asend, lsn, connect)
        ctx = replace(self._context(got.value, system_messages), served_by=got.by)
        return await attachments.aattach(got.connect, ctx, self.attachments)

    async def segment(self, agent: str, channel: str, thread: str | None = None) -> SegmentRead:
        """`ContextReader.segment`, for asyncio."""
        read = self._thread_read(agent, channel, thread)
        async with await self._aconn() as conn:
            parts = await read.afetch(conn)
        return _segment_read(parts, self.system_messages)

    async def sessions(
        self, agent: str, channel: str | None = None, *, page: int = 1, per_page: int = PER_PAGE
    ) -> SessionPage:
        """Saved sessions of a conversation (or of all the agent's channels), newest first."""
        params = page_params(agent, channel, page, per_page)
        rows = await self._read(lambda conn: _asend_rows(conn, "list_sessions", params, LISTED))
        return to_page(rows, page, per_page)

    async def session(
        self, session_id: str, *, agent: str | None = None, channel: str | None = None
    ) -> SessionInfo:
        """One live session; `Refused` ("there is no session") if unknown, deleted, or of
        another conversation than the one named."""
        return (await self._session(session_id, agent, channel))[0]

    async def session_messages(
        self, session_id: str, *, agent: str | None = None, channel: str | None = None
    ) -> tuple[SessionInfo, list[SessionMessage]]:
        """`ContextReader.session_messages`, for asyncio."""
        info, seqs = await self._session(session_id, agent, channel)
        params = {"agent": info.agent, "channel": info.channel, "seqs": seqs}
        rows = await self._read(
            lambda conn: _asend_rows(conn, "session_messages", params, MESSAGES)
        )
        return info, rows

    async def _session(
        self, session_id: str, agent: str | None, channel: str | None
    ) -> tuple[SessionInfo, list[int]]:
        params = {"session_id": session_id, "agent": agent, "channel": channel}
        rows = await self._read(lambda conn: _asend_rows(conn, "get_session", params, FOUND))
        return pick(rows, session_id, agent, channel)

    async def search(
        self,
        agent: str,
        query: str,
        *,
        channel: str | None = None,
        thread: str | None = None,
        sender: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        page: int = 1,
        per_page: int = found.PER_PAGE,
    ) -> found.SearchPage:
        """`ContextReader.search`, for asyncio."""
        scope = found.Scope(channel, thread, sender, since, until)
        params = found.params(agent, query, scope, page, per_page)
        rows = await self._read(lambda conn: _asend_hits(conn, params))
        details: list[found.DetailRow] = []
        if hits := found.hits_of(rows):
            more = found.details_params(params, hits)
            details = await self._read(lambda conn: _asend_details(conn, more))
        return found.to_page(query, rows, details, page, per_page)

    async def _read(self, send: ASend[T]) -> T:
        """`ContextReader._read`, for asyncio."""
        if self.replica is None:
            async with await self._aconn(_deadline(READ_TIMEOUT_S)) as conn:
                return await afetch_sent(conn, send)
        return (await self.replica.read(send, None, self._aconn)).value

    async def _wait(
        self,
        conn: Any,
        event_id: str,
        timeout: float,
        agent: str,
        channel: str,
        then: Callable[[Any], Awaitable[Callable[[], Awaitable[T]]]] | None = None,
        look: str = "await_event",
        deadline: float | None = None,
    ) -> tuple[Any, T | None]:
        """`ContextReader._wait`, for asyncio."""
        wait = timeout if deadline is None else _wait_budget(deadline)  # Postgres waits this long
        params = {"event_id": event_id, "agent": agent, "channel": channel, "timeout": wait}
        listening = True
        try:
            try:
                async with conn.pipeline() as pipeline:
                    await conn.execute(query("listen_commits"))  # see `ContextReader._wait`
                    await pipeline.sync()
                    waited = await conn.execute(query(look), params)
                    await conn.execute(query("unlisten_commits"))
                    collect = await then(conn) if then else None
            except psycopg.errors.QueryCanceled as e:
                raise _cut_short(event_id, timeout, e) from e
            listening = False
            if (row := await waited.fetchone()) is None:
                raise _not_visible(event_id, timeout)
            return row[0], (await collect() if collect else None)
        finally:
            if listening:
                await conn.execute(query("unlisten_commits"))

    async def connection(self, deadline: float | None = None) -> Any:
        """`ContextReader.connection`, for asyncio: `async with await r.connection():`."""
        return await self._aconn(deadline)

    async def _aconn(self, deadline: float | None = None) -> Any:
        """`connection`, under the name the reader's own reads pass around."""
        deadline = deadline or _deadline(CONNECTION_TIMEOUT_S)
        if self.pool.closed:
            await self.pool.open(wait=False)  # see `ContextReader.connection`
        return self._aguarded(deadline)

    @asynccontextmanager
    async def _aguarded(self, deadline: float) -> AsyncIterator[Any]:
        try:
            wait = max(0.0, deadline - time.monotonic())
            async with self.pool.connection(timeout=wait) as conn:
                with self.watchdog.guard(conn.fileno(), deadline) as guard:
                    try:
                        yield conn
                    except psycopg.OperationalError as e:  # the connection, not the request
                        raise _no_answer(e) if guard.cut else _lost(e) from e
                    finally:
                        if guard.cut:
                            await conn.close()  # cut: the pool must not hand it out again
        except PoolTimeout as e:
            raise _no_connection(e) from e

    async def aclose(self) -> None:
        """Close the pools."""
        await self.pool.close()
        if self.replica is not None:
            await self.replica.aclose()


async def _aconfigure(conn: Any) -> None:
    psycopg.types.json.set_json_loads(msgspec.json.decode, conn)
    await conn.execute(_ONE_PLAN)


def _send_hits(conn: Any, params: dict[str, Any]) -> Callable[[], list[found.HitRow]]:
    """Queue a search page. Its values are bound in the statement's text (a client-side
    cursor): the planner then sees the query's words and plans for them, which no server
    parameter allows here (the reader's connections plan every statement generically)."""
    cur = psycopg.ClientCursor(conn, row_factory=class_row(found.HitRow))
    cur.execute(query("search_messages"), params, prepare=False)
    return cur.fetchall


async def _asend_hits(
    conn: Any, params: dict[str, Any]
) -> Callable[[], Awaitable[list[found.HitRow]]]:
    """`_send_hits` on an asyncio connection."""
    cur = psycopg.AsyncClientCursor(conn, row_factory=class_row(found.HitRow))
    await cur.execute(query("search_messages"), params, prepare=False)
    return cur.fetchall


def _send_details(conn: Any, params: dict[str, Any]) -> Callable[[], list[found.DetailRow]]:
    """Queue what a page's hits show (prepared, as psycopg prepares a repeated query)."""
    cur = conn.cursor(row_factory=class_row(found.DetailRow))
    cur.execute(query("search_details"), params)
    return cur.fetchall  # type: ignore[no-any-return]


async def _asend_details(
    conn: Any, params: dict[str, Any]
) -> Callable[[], Awaitable[list[found.DetailRow]]]:
    """`_send_details` on an asyncio connection."""
    cur = conn.cursor(row_factory=class_row(found.DetailRow))
    await cur.execute(query("search_details"), params)
    return cur.fetchall  # type: ignore[no-any-return]


def _send_rows(conn: Any, name: str, params: dict[str, Any], rows: Any) -> Callable[[], Any]:
    """Queue the named query, its rows read by `rows` (a row factory); collect them."""
    return conn.cursor(row_factory=rows).execute(query(name), params).fetchall  # type: ignore[no-any-return]


async def _asend_rows(
    conn: Any, name: str, params: dict[str, Any], rows: Any
) -> Callable[[], Awaitable[list[Any]]]:
    """`_send_rows`, for asyncio."""
    cur = await conn.cursor(row_factory=rows).execute(query(name), params)
    return cur.fetchall  # type: ignore[no-any-return]
