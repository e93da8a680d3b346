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
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from contextlog.producers import attachments, liveness
from contextlog.producers.context import Context, StoredMessage, build_context, clean_start
from contextlog.producers.history import (
    PER_PAGE,
    SessionInfo,
    SessionMessage,
    SessionPage,
    page_params,
    pick,
    to_messages,
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
from contextlog.producers.tails import NO_HINT, Known, Row, Tails, fill
from contextlog.schema.defaults import ConversationDefaults
from contextlog.schema.errors import NotVisible, Unavailable
from contextlog.schema.queries import query

T = TypeVar("T")
Parts = tuple["ConversationState | None", list[Row], list[tuple[Any, ...]]]
_content = msgspec.json.Decoder()  # a window row's content, sent as JSON text


@dataclass(frozen=True)
class ConversationState:
    """The projection row of a conversation (settings None: the deployment default)."""

    cleared_seq: int = 0
    cleared_at: dt.datetime | None = None
    rolling_window: int | None = None
    idle_timeout: int | None = None
    token_budget: int | None = None
    last_activity_at: dt.datetime | None = None
    restored_session: str | None = None  # while its restore is within the window
    restored_saved_at: dt.datetime | None = None
    restored_summary: str | None = None
    compaction_summary: str | None = None  # of this thread's older, compacted part


@dataclass(frozen=True)
class Window:
    """Where a conversation's window starts and the token budget it must fit."""

    start: dt.datetime
    budget: int


def plan(
    state: ConversationState | None, defaults: ConversationDefaults, now: dt.datetime
) -> Window:
    """The window starts at max(last clear, rolling cut-off); the window query computes
    the same cut-off in SQL to select the rows."""
    state = state or ConversationState()
    cutoff = rolling_cutoff(now, state.rolling_window or defaults.rolling_window)
    start = max(cutoff, state.cleared_at) if state.cleared_at else cutoff
    return Window(start, state.token_budget or defaults.token_budget)


def rolling_cutoff(now: dt.datetime, window: int) -> dt.datetime:
    """now - window, floored to a step of 1/24 of the window: the window's edge moves
    once a step, not with every read, so the context's first turns (the prompt cache's
    prefix) stay put in between (the `window_messages` query floors the same way)."""
    step = max(1, window // 24)
    edge = (now - dt.timedelta(seconds=window)).timestamp()
    return dt.datetime.fromtimestamp(edge // step * step, dt.UTC)


def preamble(
    state: ConversationState | None, threads: Sequence[tuple[str, int, dt.datetime]]
) -> str | None:
    """The system text: a resumed session and its summary, the summary of the compacted
    older part, the conversation's other active threads (names only, sorted: counts and
    activity times would change the text, and so the prompt cache's prefix, every turn)."""
    parts = []
    if state is not None and state.restored_session:
        saved = state.restored_saved_at
        when = f" (saved {saved:%Y-%m-%d %H:%M UTC})" if saved else ""
        summary = state.restored_summary or "(its summary is still being written)"
        parts.append(
            f"Resumed saved session {state.restored_session}{when}. Its summary: {summary}"
        )
    if state is not None and state.compaction_summary:
        parts.append(
            f"Summary of the earlier part of this conversation: {state.compaction_summary}"
        )
    if threads:
        lines = ["Other active threads in this conversation:"]
        for name, _count, _last in sorted(threads):
            lines.append("- main line" if name == "" else f"- thread {name}")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) or None


def stored(rows: Sequence[Row]) -> list[StoredMessage]:
    """Window rows (seq, occurred_at, tokens, role, content as JSON text, ...) as messages,
    decoded afresh: no two reads share a block."""
    return [StoredMessage(r[0], r[3], _content.decode(r[4]), r[2], r[1]) for r in rows]


def assemble(
    state: ConversationState | None,
    q: Window,
    rows: Sequence[tuple[Any, ...]],
    threads: Sequence[tuple[str, int, dt.datetime]],
) -> Context:
    """The context from the fetched rows (seq, occurred_at, tokens, role, content)."""
    system = preamble(state, threads)
    compacted = state is not None and bool(state.compaction_summary)
    return build_context(
        stored(rows),
        budget=q.budget,
        system=system,
        window_start=q.start,
        compacted=compacted,
        before=[r[5] for r in rows] or None,
    )


def complete(rows: Sequence[Row]) -> bool:
    """Whether the bounded fetch holds a turn to start at (a user message answering no
    tool call); if not (the newest exchange alone passes the coarse cut, or a tool
    cycle spans it), the reader fetches the whole window instead: rare, and correct."""
    return not rows or any(
        r[3] == "user" and clean_start(r[3], _content.decode(r[4])) for r in rows
    )


def _state(row: tuple[Any, ...] | None) -> ConversationState | None:
    return None if row is None else ConversationState(*row)


# psycopg prepares a statement run 5 times; Postgres would still plan the window query
# afresh for each read (its estimates favour custom plans), ~0.6 ms of a ~1.5 ms read.
# The query fixes its own plan's shape (MATERIALIZED, OFFSET 0, LIMIT 1), so the plan
# made once per connection serves every read.
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


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


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
    return _Lost(f"Postgres: {' '.join(str(error).split())}")


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


def window_params(
    agent: str,
    channel: str,
    thread: str | None,
    now: dt.datetime,
    defaults: ConversationDefaults,
    *,
    bounded: bool = False,
) -> dict[str, Any]:
    """Parameters of `window_messages`; `bounded`: fetch only the rows the budget's
    coarse trim keeps (the reader), not the whole window (compaction). No tail hint:
    `Tails.hint` adds one (producers/tails.py)."""
    return {
        "agent": agent,
        "channel": channel,
        "thread": thread or "",
        "now": now,
        "default_window": defaults.rolling_window,
        "default_budget": defaults.token_budget,
        "bounded": bounded,
        **NO_HINT,
    }


def _whole(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters that fetch the whole window: not cut, not from a hint."""
    return {**params, "bounded": False, **NO_HINT}


def window_query(params: dict[str, Any]) -> str:
    """The read of a thread's window: from the reader's last read when it has one."""
    return "window_messages" if params["hint_seq"] is None else "window_tail"


def send_window(conn: Any, params: dict[str, Any], known: Known) -> Callable[[], Parts]:
    """Send the three reads of a context (on a connection in pipeline mode, they travel
    with whatever else is queued); returns how to collect them. `known`: the rows of the
    thread's last read (`Tails.hint`), which come back without their payload."""
    state_cur = conn.execute(query("conversation_state"), params)
    rows_cur = conn.cursor().execute(query(window_query(params)), params)
    threads_cur = conn.cursor().execute(query("active_threads"), params)

    def collect() -> Parts:
        state = _state(state_cur.fetchone())
        got, threads = rows_cur.fetchall(), threads_cur.fetchall()
        if not got and known:  # a stale hint: the window from its start
            got = conn.execute(query("window_messages"), {**params, **NO_HINT}).fetchall()
        rows = fill(got, known)
        if rows is None or not complete(rows):  # no turn to start at in the bounded fetch
            rows = conn.execute(query("window_messages"), _whole(params)).fetchall()
        return state, rows, threads

    return collect


async def asend_window(
    conn: Any, params: dict[str, Any], known: Known
) -> Callable[[], Awaitable[Parts]]:
    """`send_window` on an asyncio connection."""
    state_cur = await conn.execute(query("conversation_state"), params)
    rows_cur = await conn.cursor().execute(query(window_query(params)), params)
    threads_cur = await conn.cursor().execute(query("active_threads"), params)

    async def collect() -> Parts:
        state = _state(await state_cur.fetchone())
        got, threads = await rows_cur.fetchall(), await threads_cur.fetchall()
        if not got and known:  # a stale hint: the window from its start
            cur = await conn.execute(query("window_messages"), {**params, **NO_HINT})
            got = await cur.fetchall()
        rows = fill(got, known)
        if rows is None or not complete(rows):
            cur = await conn.execute(query("window_messages"), _whole(params))
            rows = await cur.fetchall()
        return state, rows, threads

    return collect


class ThreadRead:
    """One context read of a thread at `now`: its parameters are taken from the tails
    when it is sent (a read sent twice, as `wait_for` may, uses what the first learned),
    and what it returned is learned when it is collected."""

    def __init__(self, tails: Tails, params: dict[str, Any]) -> None:
        self.tails = tails
        self.params = params  # without a hint

    def send(self, conn: Any) -> Callable[[], Parts]:
        """`send_window` with the thread's hint and known rows."""
        params, known = self.tails.hint(self.params)
        collect = send_window(conn, params, known)

        def learned() -> Parts:
            parts = collect()
            self.tails.learn(self.params, parts[1])
            return parts

        return learned

    def fetch(self, conn: Any) -> Parts:
        """The conversation's state, window rows and other threads: one round trip
        (pipeline mode), a second one only when the bounded fetch holds no turn to
        start at."""
        return fetch_sent(conn, self.send)

    async def asend(self, conn: Any) -> Callable[[], Awaitable[Parts]]:
        """`send` on an asyncio connection."""
        params, known = self.tails.hint(self.params)
        collect = await asend_window(conn, params, known)

        async def learned() -> Parts:
            parts = await collect()
            self.tails.learn(self.params, parts[1])
            return parts

        return learned

    async def afetch(self, conn: Any) -> Parts:
        """`fetch` on an asyncio connection."""
        return await afetch_sent(conn, self.asend)


def _policy(max_replica_lag: float, replica_wait: float) -> Policy:
    return Policy(max_lag=max_replica_lag, wait=replica_wait)


class _Reader:
    def __init__(
        self,
        *,
        defaults: ConversationDefaults | None = None,
        clock: Callable[[], dt.datetime] = _now,
    ) -> None:
        # The reader's one look at the environment: deployment-wide setting defaults.
        self.defaults = defaults or ConversationDefaults.from_env(os.environ)
        self.clock = clock
        self.attachments = attachments.Cache()  # base64 of recently read attachments
        self.tails = Tails()  # where each thread's last read started
        self.replica: Replica | AsyncReplica | None = None
        self.watchdog = liveness.Watchdog()  # cuts a call still running at its deadline

    @property
    def routing(self) -> dict[str, int]:
        """Reads served by the primary and by the replica, and the primary's fallbacks by
        reason (lagging, behind, down, error); empty without a replica."""
        return {} if self.replica is None else self.replica.routing.snapshot()

    def _thread_read(
        self, agent: str, channel: str, thread: str | None, now: dt.datetime
    ) -> ThreadRead:
        params = window_params(agent, channel, thread, now, self.defaults, bounded=True)
        return ThreadRead(self.tails, params)

    def _context(self, parts: Parts, now: dt.datetime) -> Context:
        state, rows, threads = parts
        return assemble(state, plan(state, self.defaults, now), rows, threads)


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
        now: dt.datetime | None = None,
    ) -> Context:
        """The context of one thread (or the main line), valid for the Messages API.
        Returns or raises within `timeout` + WAIT_MARGIN_S, whatever Postgres does."""
        deadline = _deadline(timeout)
        now = now or self.clock()
        read = self._thread_read(agent, channel, thread, now)

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
            ctx = self._context(parts, now)
            return attachments.attach(connect, ctx, self.attachments)
        lsn = None
        if wait_for is not None:  # on the primary: a standby cannot LISTEN
            with connect() as conn:
                look = "await_event_at"
                lsn = self._wait(conn, wait_for, timeout, agent, channel, None, look, deadline)[0]
        got = self.replica.read(read.send, lsn, connect)
        ctx = replace(self._context(got.value, now), served_by=got.by)
        return attachments.attach(got.connect, ctx, self.attachments)

    def sessions(
        self, agent: str, channel: str | None = None, *, page: int = 1, per_page: int = PER_PAGE
    ) -> SessionPage:
        """Saved sessions of a conversation (or of all the agent's channels), newest first."""
        params = page_params(agent, channel, page, per_page)
        rows = self._read(lambda conn: conn.execute(query("list_sessions"), params).fetchall)
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
        rows = self._read(lambda conn: conn.execute(query("session_messages"), params).fetchall)
        return info, to_messages(rows)

    def _session(
        self, session_id: str, agent: str | None, channel: str | None
    ) -> tuple[SessionInfo, list[int]]:
        params = {"session_id": session_id, "agent": agent, "channel": channel}
        rows = self._read(lambda conn: conn.execute(query("get_session"), params).fetchall)
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
        now: dt.datetime | None = None,
    ) -> Context:
        """The context of one thread (or the main line), valid for the Messages API.
        Returns or raises within `timeout` + WAIT_MARGIN_S, whatever Postgres does."""
        deadline = _deadline(timeout)

        async def connect() -> Any:
            return await self._aconn(deadline)

        if self.replica is None:
            now = now or self.clock()
            read = self._thread_read(agent, channel, thread, now)
            async with await connect() as conn:
                if wait_for is None:
                    parts = await read.afetch(conn)
                else:  # the reads ride with the looks for the event
                    waited = await self._wait(
                        conn, wait_for, timeout, agent, channel, read.asend, deadline=deadline
                    )
                    assert waited[1] is not None
                    parts = waited[1]
            ctx = self._context(parts, now)
            return await attachments.aattach(connect, ctx, self.attachments)
        lsn = None
        if wait_for is not None:  # on the primary: a standby cannot LISTEN
            async with await connect() as conn:
                look = "await_event_at"
                waited = await self._wait(
                    conn, wait_for, timeout, agent, channel, None, look, deadline
                )
                lsn = waited[0]
        now = now or self.clock()
        read = self._thread_read(agent, channel, thread, now)
        got = await self.replica.read(read.asend, lsn, connect)
        ctx = replace(self._context(got.value, now), served_by=got.by)
        return await attachments.aattach(got.connect, ctx, self.attachments)

    async def sessions(
        self, agent: str, channel: str | None = None, *, page: int = 1, per_page: int = PER_PAGE
    ) -> SessionPage:
        """Saved sessions of a conversation (or of all the agent's channels), newest first."""
        params = page_params(agent, channel, page, per_page)
        rows = await self._read(lambda conn: _asend_rows(conn, "list_sessions", params))
        return to_page(rows, page, per_page)

    async def session(
        self, session_id: str, *, agent: str | None = None, channel: str | None = None
    ) -> SessionInfo:
        """One live session; `Refused` ("there is no session") if unknown, deleted, or of
        another conversation than the one named."""
        params = {"session_id": session_id, "agent": agent, "channel": channel}
        rows = await self._read(lambda conn: _asend_rows(conn, "get_session", params))
        return pick(rows, session_id, agent, channel)[0]

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

    async def _aconn(self, deadline: float | None = None) -> Any:
        """`ContextReader.connection`, for asyncio."""
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


async def _asend_rows(
    conn: Any, name: str, params: dict[str, Any]
) -> Callable[[], Awaitable[list[tuple[Any, ...]]]]:
    """Queue the named query; collect its rows."""
    cur = await conn.execute(query(name), params)
    return cur.fetchall  # type: ignore[no-any-return]
