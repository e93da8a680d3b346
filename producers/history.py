"""Saved sessions as adapters read them: history pages, one session, its messages."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from psycopg.rows import class_row, kwargs_row

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


def _listed(*, total: int, **fields: Any) -> tuple[SessionInfo, int]:
    return SessionInfo(**fields), int(total)


def _found(*, seqs: list[int], **fields: Any) -> tuple[SessionInfo, list[int]]:
    return SessionInfo(**fields), [int(s) for s in seqs]


# How the session queries' rows are read: by column name into `SessionInfo` (a query whose
# columns stop matching the fields fails, rather than shifting them).
LISTED: Final = kwargs_row(_listed)  # `list_sessions`: (session, total count)
FOUND: Final = kwargs_row(_found)  # `get_session`: (session, its messages' positions)
MESSAGES: Final = class_row(SessionMessage)  # `session_messages`


def to_page(rows: Sequence[tuple[SessionInfo, int]], page: int, per_page: int) -> SessionPage:
    """Rows of `list_sessions` (`LISTED`)."""
    total = rows[0][1] if rows else 0
    return SessionPage([info for info, _ in rows], page, per_page, total)


def pick(
    rows: Sequence[tuple[SessionInfo, list[int]]],
    session_id: str,
    agent: str | None,
    channel: str | None,
) -> tuple[SessionInfo, list[int]]:
    """The one session `session_id` names in the given conversation (rows of `get_session`,
    `FOUND`), or why not. An id of another conversation is answered as one that does not
    exist: the refusal must not tell a caller what other conversations hold."""
    mine = [
        (info, seqs)
        for info, seqs in rows
        if (agent is None or info.agent == agent) and (channel is None or info.channel == channel)
    ]
    if not mine:
        raise Refused(f"there is no session {session_id!r}")
    if len(mine) > 1:
        where = ", ".join(f"{info.agent}/{info.channel}" for info, _ in mine)
        raise Refused(
            f"session id {session_id!r} exists in several conversations ({where}): "
            "name the agent and channel"
        )
    return mine[0]
