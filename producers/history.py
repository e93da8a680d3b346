"""Saved sessions as adapters read them: history pages, one session, its messages."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from contextlog.schema import codec
from contextlog.schema.errors import Refused

PER_PAGE = 10


@dataclass(frozen=True)
class SessionInfo:
    """One saved session (`summary` is None while its summary is being written)."""

    session_id: str
    agent: str
    channel: str
    created_at: dt.datetime
    description: str | None
    summary: str | None
    message_count: int
    token_estimate: int
    auto: bool
    preview: str
    summary_local: bool = False
    summary_failed: bool = False
    provider: str | None = None
    model: str | None = None
    window_start: dt.datetime | None = None
    window_end: dt.datetime | None = None
    # An imported session: when it was saved where it was exported (`created_at` is when
    # it was imported here, which orders the list).
    imported_from: dt.datetime | None = None

    @property
    def pending(self) -> bool:
        """Whether the summary job has not landed yet."""
        return self.summary is None


@dataclass(frozen=True)
class SessionPage:
    """One page of history, newest first; iterate it for the sessions."""

    sessions: list[SessionInfo]
    page: int
    per_page: int
    total: int

    @property
    def pages(self) -> int:
        """How many pages there are (at least 1)."""
        return max(1, -(-self.total // self.per_page))

    def __iter__(self) -> Iterator[SessionInfo]:
        return iter(self.sessions)

    def __len__(self) -> int:
        return len(self.sessions)


@dataclass(frozen=True)
class SessionMessage:
    """A message of a session, as stored."""

    seq: int
    thread: str
    occurred_at: dt.datetime
    tokens: int
    role: str
    content: str | list[dict[str, Any]]


def page_params(agent: str, channel: str | None, page: int, per_page: int) -> dict[str, Any]:
    """Query parameters of one history page; a bad page number is refused."""
    if page < 1 or not 1 <= per_page <= 100:
        raise ValueError(f"page must be >= 1 and per_page 1..100, not {page}/{per_page}")
    codec.check_names(agent=agent, channel=channel)
    return {"agent": agent, "channel": channel, "limit": per_page, "offset": (page - 1) * per_page}


def to_page(rows: Sequence[tuple[Any, ...]], page: int, per_page: int) -> SessionPage:
    """Rows of `list_sessions` (the last column is the total count)."""
    total = int(rows[0][-1]) if rows else 0
    return SessionPage([_info(r[:17]) for r in rows], page, per_page, total)


def _info(row: Sequence[Any]) -> SessionInfo:
    agent, channel, sid, *rest = row
    return SessionInfo(sid, agent, channel, *rest)


def pick(
    rows: Sequence[tuple[Any, ...]], session_id: str, agent: str | None, channel: str | None
) -> tuple[SessionInfo, list[int]]:
    """The one session `session_id` names in the given conversation, or why not. An id of
    another conversation is answered as one that does not exist: the refusal must not
    tell a caller what other conversations hold."""
    mine = [
        r for r in rows if (agent is None or r[0] == agent) and (channel is None or r[1] == channel)
    ]
    if not mine:
        raise Refused(f"there is no session {session_id!r}")
    if len(mine) > 1:
        where = ", ".join(f"{r[0]}/{r[1]}" for r in mine)
        raise Refused(
            f"session id {session_id!r} exists in several conversations ({where}): "
            "name the agent and channel"
        )
    return _info(mine[0][:17]), [int(s) for s in mine[0][17]]


def to_messages(rows: Sequence[tuple[Any, ...]]) -> list[SessionMessage]:
    """Rows of `session_messages` (seq, thread, occurred_at, tokens, role, content)."""
    return [SessionMessage(*r) for r in rows]
