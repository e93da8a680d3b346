"""Read models for adapters: the rolling-window context of a conversation, from Postgres."""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import psycopg
import psycopg.types.json
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from contextlog.producers import attachments
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
from contextlog.schema.defaults import ConversationDefaults
from contextlog.schema.errors import NotVisible, Unavailable
from contextlog.schema.queries import query

# `wait_for` sleeps until ingest's commit notification (LISTEN contextlog_commits); it also
# re-checks at least this often, should a notification not come (an older ingest, a lost one).
POLL_SECONDS = 0.05


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


def stored(rows: Sequence[tuple[Any, ...]]) -> list[StoredMessage]:
    """Window rows (seq, occurred_at, tokens, role, content, ...) as messages."""
    return [StoredMessage(r[0], r[3], r[4], r[2], r[1]) for r in rows]


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


def complete(rows: Sequence[tuple[Any, ...]]) -> bool:
    """Whether the bounded fetch holds a turn to start at (a user message answering no
    tool call); if not (the newest exchange alone passes the coarse cut, or a tool
    cycle spans it), the reader fetches the whole window instead: rare, and correct."""
    return not rows or any(clean_start(r[3], r[4]) for r in rows)


def _state(row: tuple[Any, ...] | None) -> ConversationState | None:
    return None if row is None else ConversationState(*row)


def _configure(conn: Any) -> None:
    # jsonb content decoded by msgspec: several times faster than the json module.
    psycopg.types.json.set_json_loads(msgspec.json.decode, conn)


def _not_visible(event_id: str, timeout: float) -> NotVisible:
    return NotVisible(
        f"event {event_id} was not stored within {timeout}s: is `contextlog ingest` running?"
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


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
    coarse trim keeps (the reader), not the whole window (compaction)."""
    return {
        "agent": agent,
        "channel": channel,
        "thread": thread or "",
        "now": now,
        "default_window": defaults.rolling_window,
        "default_budget": defaults.token_budget,
        "bounded": bounded,
    }


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


# Connections are opened on first use (never at import or construction time).
_POOL: dict[str, Any] = {
    "min_size": 1,
    "max_size": 4,
    "open": False,
    "kwargs": {"autocommit": True},
}


class ContextReader(_Reader):
    """Synchronous reader: `r.context(agent, channel)` before every LLM turn."""

    def __init__(self, pool: ConnectionPool[Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pool = pool

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> ContextReader:
        """A reader on the Postgres at `url`; connects on first use."""
        pool = ConnectionPool(url, configure=_configure, **_POOL)
        return cls(pool, **kwargs)

    def connection(self) -> Any:
        """A pooled connection (a context manager); the pool opens on first use."""
        if self.pool.closed:
            try:
                self.pool.open(wait=True, timeout=10)
            except psycopg.Error as e:
                raise Unavailable(f"Postgres: {e}") from e
        return self.pool.connection()

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
        """The context of one thread (or the main line), valid for the Messages API."""
        now = now or self.clock()
        params = window_params(agent, channel, thread, now, self.defaults, bounded=True)
        with self.connection() as conn:
            if wait_for is not None:
                self._wait(conn, wait_for, timeout)
            with conn.pipeline():  # the three reads in one round trip
                state_cur = conn.execute(query("conversation_state"), params)
                rows_cur = conn.cursor().execute(query("window_messages"), params)
                threads_cur = conn.cursor().execute(query("active_threads"), params)
            state = _state(state_cur.fetchone())
            rows, threads = rows_cur.fetchall(), threads_cur.fetchall()
            if not complete(rows):
                rows = conn.execute(
                    query("window_messages"), {**params, "bounded": False}
                ).fetchall()
        ctx = assemble(state, plan(state, self.defaults, now), rows, threads)
        return attachments.attach(self.connection, ctx, self.attachments)

    def sessions(
        self, agent: str, channel: str | None = None, *, page: int = 1, per_page: int = PER_PAGE
    ) -> SessionPage:
        """Saved sessions of a conversation (or of all the agent's channels), newest first."""
        params = page_params(agent, channel, page, per_page)
        with self.connection() as conn:
            rows = conn.execute(query("list_sessions"), params).fetchall()
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
        with self.connection() as conn:
            rows = conn.execute(query("session_messages"), params).fetchall()
        return info, to_messages(rows)

    def _session(
        self, session_id: str, agent: str | None, channel: str | None
    ) -> tuple[SessionInfo, list[int]]:
        params = {"session_id": session_id, "agent": agent, "channel": channel}
        with self.connection() as conn:
            rows = conn.execute(query("get_session"), params).fetchall()
        return pick(rows, session_id, agent, channel)

    def _wait(self, conn: Any, event_id: str, timeout: float) -> None:
        """Until `event_id` is stored: sleep on ingest's commit notifications, not a timer.

        Two round trips when ingest commits while we wait (the usual read-your-writes
        case): listen + look, then, once woken, look + stop listening. A look that finds
        nothing after stopping listens again first (no commit slips in between).
        """
        params = {"event_id": event_id}
        deadline = time.monotonic() + timeout
        with conn.pipeline():
            conn.execute(query("listen_commits"))
            visible = conn.execute(query("event_visible"), params)
        listening = True
        try:
            while visible.fetchone() is None:
                if not listening:
                    with conn.pipeline():
                        conn.execute(query("listen_commits"))
                        visible = conn.execute(query("event_visible"), params)
                    listening = True
                    continue
                if (left := deadline - time.monotonic()) <= 0:
                    raise _not_visible(event_id, timeout)
                for _ in conn.notifies(timeout=min(left, POLL_SECONDS), stop_after=1):
                    pass
                with conn.pipeline():
                    visible = conn.execute(query("event_visible"), params)
                    conn.execute(query("unlisten_commits"))
                listening = False
        finally:
            if listening:  # the pooled connection must not keep receiving them
                conn.execute(query("unlisten_commits"))

    def close(self) -> None:
        """Close the pool."""
        self.pool.close()


class AsyncContextReader(_Reader):
    """asyncio reader: `await r.context(agent, channel)`."""

    def __init__(self, pool: AsyncConnectionPool[Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pool = pool

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> AsyncContextReader:
        """A reader on the Postgres at `url`; connects on first use."""
        pool = AsyncConnectionPool(url, configure=_aconfigure, **_POOL)
        return cls(pool, **kwargs)

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
        """The context of one thread (or the main line), valid for the Messages API."""
        async with await self._aconn() as conn:
            if wait_for is not None:
                await self._wait(conn, wait_for, timeout)
            now = now or self.clock()
            params = window_params(agent, channel, thread, now, self.defaults, bounded=True)
            async with conn.pipeline():  # the three reads in one round trip
                state_cur = await conn.execute(query("conversation_state"), params)
                rows_cur = await conn.cursor().execute(query("window_messages"), params)
                threads_cur = await conn.cursor().execute(query("active_threads"), params)
            state = _state(await state_cur.fetchone())
            rows, threads = await rows_cur.fetchall(), await threads_cur.fetchall()
            if not complete(rows):
                cur = await conn.execute(query("window_messages"), {**params, "bounded": False})
                rows = await cur.fetchall()
        ctx = assemble(state, plan(state, self.defaults, now), rows, threads)
        return await attachments.aattach(self._aconn, ctx, self.attachments)

    async def sessions(
        self, agent: str, channel: str | None = None, *, page: int = 1, per_page: int = PER_PAGE
    ) -> SessionPage:
        """Saved sessions of a conversation (or of all the agent's channels), newest first."""
        params = page_params(agent, channel, page, per_page)
        async with await self._aconn() as conn:
            rows = await (await conn.execute(query("list_sessions"), params)).fetchall()
        return to_page(rows, page, per_page)

    async def session(
        self, session_id: str, *, agent: str | None = None, channel: str | None = None
    ) -> SessionInfo:
        """One live session; `Refused` ("there is no session") if unknown, deleted, or of
        another conversation than the one named."""
        params = {"session_id": session_id, "agent": agent, "channel": channel}
        async with await self._aconn() as conn:
            rows = await (await conn.execute(query("get_session"), params)).fetchall()
        return pick(rows, session_id, agent, channel)[0]

    async def _wait(self, conn: Any, event_id: str, timeout: float) -> None:
        """`ContextReader._wait`, for asyncio."""
        params = {"event_id": event_id}
        deadline = time.monotonic() + timeout
        async with conn.pipeline():
            await conn.execute(query("listen_commits"))
            visible = await conn.execute(query("event_visible"), params)
        listening = True
        try:
            while await visible.fetchone() is None:
                if not listening:
                    async with conn.pipeline():
                        await conn.execute(query("listen_commits"))
                        visible = await conn.execute(query("event_visible"), params)
                    listening = True
                    continue
                if (left := deadline - time.monotonic()) <= 0:
                    raise _not_visible(event_id, timeout)
                async for _ in conn.notifies(timeout=min(left, POLL_SECONDS), stop_after=1):
                    pass
                async with conn.pipeline():
                    visible = await conn.execute(query("event_visible"), params)
                    await conn.execute(query("unlisten_commits"))
                listening = False
        finally:
            if listening:
                await conn.execute(query("unlisten_commits"))

    async def _aconn(self) -> Any:
        if self.pool.closed:
            try:
                await self.pool.open(wait=True, timeout=10)
            except psycopg.Error as e:
                raise Unavailable(f"Postgres: {e}") from e
        return self.pool.connection()

    async def aclose(self) -> None:
        """Close the pool."""
        await self.pool.close()


async def _aconfigure(conn: Any) -> None:
    _configure(conn)
