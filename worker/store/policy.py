"""Retention by policy (issue 34.2): what the worker's retention step removes, and the two
commands it and the adapters use.

A conversation keeps its log for N days after its last activity and its saved sessions
for N days after they were saved: its agent's rules (`Settings.retention`), overridden per
conversation by `retention.v1` (`Producer.set_retention`). Each sweep of the worker:

1. sessions past their time are expired *through the log*: the step pushes an
   `expire_sessions.v1` to the conversation (its id derived from the cut-off hour, so a
   run repeated before ingest got to it pushes nothing new), and ingest removes them in
   order (`on_sessions_expired`), so `contextlog rebuild` removes them too;
2. conversations whose log is past its time, and that no live session holds, are dropped
   whole, one transaction each, as `contextlog retire` drops them (archived first when
   CONTEXTLOG_RETENTION_ARCHIVE names a directory): their events, projections, search rows,
   notes and attachment references; attachments no other event references are deleted
   (kept when archived: `retire --restore` needs them). The log of the others is what it
   was, so a rebuild gives the same state.

A step is bounded (`limit` conversations each), idempotent (what is gone is not found
again; a conversation that came back to life meanwhile is left, checked under its row
lock) and resumable (each conversation commits alone; a crash leaves the rest for the next
sweep). One worker runs it at a time (an advisory lock); each run is recorded in
`retention_runs` for `contextlog status`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec
import psycopg
from psycopg.rows import TupleRow

from contextlog.producers.ids import derived_id
from contextlog.schema import events as ev
from contextlog.schema.defaults import ConversationDefaults, Retention
from contextlog.schema.queries import query
from contextlog.worker.effects.kinds import Effect
from contextlog.worker.store import retention
from contextlog.worker.store.locks import RETENTION_LOCK
from contextlog.worker.store.replies import Cursor, key

SOURCE: Final = "contextlog-retention"  # the namespace of its derived event ids
EXPIRED_WHY: Final = "the session expired"
Conv = tuple[str, str]


def on_retention_set(
    cur: Cursor, e: ev.RetentionSet, seq: int, at: dt.datetime, d: ConversationDefaults
) -> list[Effect]:
    """A conversation's own retention, over its agent's."""
    params = {**key(e), "log": e.keep_log_days, "sessions": e.keep_sessions_days}
    cur.execute(query("retention_set"), params)
    return []


def on_sessions_expired(
    cur: Cursor, e: ev.SessionsExpired, seq: int, at: dt.datetime, d: ConversationDefaults
) -> list[Effect]:
    """Remove the conversation's sessions saved before the cut-off, with the webhook
    bodies of their summaries; a thread's header or note that told one's summary loses
    that text (a boundary)."""
    gone = [sid for (sid,) in cur.execute(query("expire_sessions"), {**key(e), "before": e.before})]
    if gone:
        forget_sessions(cur, e.agent, e.channel, gone, "expire", EXPIRED_WHY)
        cur.execute(query("expire_session_deliveries"), {**key(e), "sessions": gone})
    return []


def forget_sessions(
    cur: Cursor, agent: str, channel: str, sessions: Sequence[str], kind: str, why: str
) -> None:
    """Take the text of `sessions` out of the conversation's thread headers and notes."""
    params = {"agent": agent, "channel": channel, "sessions": list(sessions)}
    cur.execute(query("forget_session_text"), {**params, "kind": kind, "why": why})
    cur.execute(query("recount_headers"), params)


def policies(rules: Retention) -> str:
    """The rules as `contextlog_keep` (017) reads them: JSON rows, -1 for ever."""
    rows: list[dict[str, Any]] = [
        {"agent": None, "log": rules.default.log, "sessions": rules.default.sessions}
    ]
    rows += [{"agent": a, "log": k.log, "sessions": k.sessions} for a, k in rules.agents]
    return msgspec.json.encode(rows).decode()


@dataclass
class Run:
    """What one retention step did and left."""

    conversations: int = 0  # dropped
    events: int = 0
    expiring: int = 0  # conversations told to expire sessions
    pinned: int = 0  # due, held by a live session
    left_due: int = 0  # due, beyond this step's bound
    error: str | None = None
    dropped: list[Conv] | None = None


def expire_events(rows: Sequence[tuple[str, str, dt.datetime]], now: dt.datetime) -> list[ev.Event]:
    """`expire_sessions.v1` for each (agent, channel, cut-off): the cut-off down to its hour,
    the id derived from it, so one hour's runs push one event a conversation."""
    out: list[ev.Event] = []
    for agent, channel, before in rows:
        hour = before.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
        about = f"expire\x00{agent}\x00{channel}\x00{hour.isoformat()}"
        out.append(
            ev.SessionsExpired(
                event_id=derived_id(SOURCE, about),
                agent=agent,
                channel=channel,
                occurred_at=now,
                before=hour,
            )
        )
    return out


def step(
    conn: psycopg.Connection[TupleRow],
    rules: Retention,
    now: dt.datetime,
    push: Callable[[list[ev.Event]], object],
    *,
    limit: int,
    archive: Path | None = None,
) -> Run | None:
    """One retention step (see the module doc); None when another worker runs one."""
    lock = {"lock": RETENTION_LOCK}
    (locked,) = conn.execute(query("retention_try_lock"), lock).fetchone() or (False,)
    conn.commit()
    if not locked:
        return None
    try:
        return _step(conn, rules, now, push, limit, archive)
    finally:
        conn.execute(query("retention_unlock"), lock)
        conn.commit()


def _step(
    conn: psycopg.Connection[TupleRow],
    rules: Retention,
    now: dt.datetime,
    push: Callable[[list[ev.Event]], object],
    limit: int,
    archive: Path | None,
) -> Run:
    params = {"now": now, "policies": policies(rules), "limit": limit}
    expiring = conn.execute(query("retention_expiring"), params).fetchall()
    due = conn.execute(query("retention_due"), params).fetchall()
    conn.rollback()
    run = Run(expiring=len(expiring), dropped=[])
    if expiring:
        push(expire_events([(a, c, b) for a, c, b in expiring], now))
    free = [(a, c, before) for a, c, before, pinned in due if not pinned]
    run.pinned = len(due) - len(free)
    run.left_due = max(0, len(free) - limit)
    dropped = retention.drop(conn, free[:limit], archive=archive, now=now)
    run.conversations, run.events = len(dropped.conversations), dropped.events
    run.dropped = dropped.conversations
    return run
