"""Request bodies into events: pure, the same rules as `producers.commands`.

An event's id is derived from (`source`, `external_id`) when the request names one (in the
body, or as an Idempotency-Key header), as the library derives a platform message's: a
request sent twice is one event. Every event is checked as ingest checks it before any is
sent (`prepare_all`), so one bad item of a batch sends nothing.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from contextlog.producers.commands import Encoder, Prepared
from contextlog.producers.ids import derived_id, uuid7
from contextlog.schema import events as ev
from contextlog.schema.errors import EventRejected
from contextlog.worker.api import models as m
from contextlog.worker.api.problems import from_error


def _message(body: Any, common: dict[str, Any]) -> ev.Event:
    return ev.MessagePosted(role=body.role, content=body.content, **common)


def _settings(body: Any, common: dict[str, Any]) -> ev.Event:
    return ev.Configured(
        rolling_window=body.rolling_window,
        idle_timeout=body.idle_timeout,
        token_budget=body.token_budget,
        **common,
    )


def _frame(body: Any, common: dict[str, Any]) -> ev.Event:
    return ev.FrameSet(
        model=body.model,
        system=body.system,
        tools=body.tools,
        thinking=ev.NULL
        if body.thinking is None
        else msgspec.Raw(msgspec.json.encode(body.thinking)),
        **common,
    )


BUILDERS: dict[str, Callable[[Any, dict[str, Any]], ev.Event]] = {
    "message": _message,
    "clear": lambda b, c: ev.ContextCleared(**c),
    "save": lambda b, c: ev.SessionSaveRequested(description=b.description, **c),
    "restore": lambda b, c: ev.SessionRestoreRequested(session_id=b.session_id, **c),
    "delete_session": lambda b, c: ev.SessionDeleteRequested(session_id=b.session_id, **c),
    "purge_sessions": lambda b, c: ev.SessionsPurgeRequested(keep=b.keep, **c),
    "configure": _settings,
    "frame": _frame,
    "retention": lambda b, c: ev.RetentionSet(
        keep_log_days=b.keep_log_days, keep_sessions_days=b.keep_sessions_days, **c
    ),
}

# The right a key needs for each kind: what a bot does on every turn, or what touches
# saved sessions.
RIGHTS: dict[str, str] = {
    "message": "post",
    "clear": "post",
    "configure": "post",
    "frame": "post",
    "retention": "admin",  # it removes data: the deployment's call
    "save": "sessions",
    "restore": "sessions",
    "delete_session": "sessions",
    "purge_sessions": "sessions",
}


def event_id(source: str | None, external_id: str | None) -> uuid.UUID:
    """Derived from the request's external id when it has one, else a fresh UUIDv7."""
    return derived_id(source, external_id) if external_id else uuid7()


def build(
    kind: str,
    agent: str,
    channel: str,
    body: Any,
    now: dt.datetime,
    idempotency_key: str | None = None,
) -> ev.Event:
    """The event of one request (`kind` as a batch item's `type`)."""
    external = body.external_id or idempotency_key
    common: dict[str, Any] = {
        "event_id": event_id(body.source, external),
        "agent": agent,
        "channel": channel,
        "thread": body.thread,
        "source": body.source,
        "sender": body.sender,
        "occurred_at": body.occurred_at or now,
    }
    if kind == "message":
        common["external_id"] = external
    return BUILDERS[kind](body, common)


def kind_of(item: m.Item) -> str:
    """A batch item's `type`."""
    return str(type(item).__struct_config__.tag)


def batch(items: Sequence[m.Item], now: dt.datetime, idempotency_key: str | None) -> list[ev.Event]:
    """The events of a batch; with an Idempotency-Key, item i without an external id of
    its own gets `<key>:<i>`."""
    return [
        build(
            kind_of(item),
            item.agent,
            item.channel,
            item,
            now,
            f"{idempotency_key}:{i}" if idempotency_key else None,
        )
        for i, item in enumerate(items)
    ]


def prepare_all(encoder: Encoder, events: Sequence[ev.Event]) -> list[Prepared]:
    """Every event checked as ingest checks it; the first bad one refuses all, named."""
    prepared = []
    for i, event in enumerate(events):
        try:
            prepared.append(encoder.prepare(event))
        except EventRejected as e:
            raise from_error(e, item=i if len(events) > 1 else None) from e
    return prepared
