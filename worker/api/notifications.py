"""Notifications as server-sent events, with consumer-group semantics (at least once).

A stream follows one adapter's notification stream (`source`) for one agent, as a consumer
of a group: what a consumer was sent and did not acknowledge is sent again when it comes
back, first. A client acknowledges by reconnecting with `Last-Event-ID` (everything up to
that id), or with `POST .../notifications/ack`. Each event's `id` is its stream entry id.

The group is the agent's own (`api:<agent>:<group>`), so a key sees and acknowledges only
its agents' notices; a key limited to channels gets a group of its own besides, since it
acknowledges unread the notices of channels it may not see.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Final

import msgspec
from starlette.responses import StreamingResponse

from contextlog.producers.notifications import AsyncNotifications
from contextlog.schema.errors import Unavailable
from contextlog.schema.notices import Notice
from contextlog.worker.api import models as m
from contextlog.worker.api import problems
from contextlog.worker.api.app import Call
from contextlog.worker.api.keys import ApiKey
from contextlog.worker.api.problems import ApiError

KEEPALIVE_S: Final = 15.0
_ENTRY_ID: Final = re.compile(r"^\d{1,20}-\d{1,20}$")
HEADERS: Final = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def group_name(agent: str, group: str, key: ApiKey) -> str:
    """The consumer group of an agent's readers (of one channel-limited key's)."""
    name = f"api:{agent}:{group}"
    return name if key.channels is None else f"{name}:{key.key_id}"


def entry_id(value: str) -> str:
    """A stream entry id (`<ms>-<seq>`), or 422."""
    if not _ENTRY_ID.match(value):
        raise ApiError(
            422, "invalid-request", f"not a notification id (ms-seq): {value!r}", reason="invalid"
        )
    return value


def _consumer(call: Call, source: str, group: str, consumer: str) -> AsyncNotifications:
    name = group_name(call.agent, group, call.api_key)
    return AsyncNotifications(call.services.redis, source, group=name, consumer=consumer)


def event(entry: str, notice: Notice) -> bytes:
    """One server-sent event."""
    return b"id: " + entry.encode() + b"\ndata: " + msgspec.json.encode(notice) + b"\n\n"


async def _events(call: Call, notes: AsyncNotifications, q: m.NotifyQuery) -> AsyncIterator[bytes]:
    clock, key = call.services.clock, call.api_key
    sent, quiet_since = 0, clock.monotonic()
    yield b": connected\n\n"
    try:
        while q.limit is None or sent < q.limit:
            left = q.wait - (clock.monotonic() - quiet_since) if q.wait else KEEPALIVE_S
            if left <= 0:
                return
            want = 100 if q.limit is None else min(100, q.limit - sent)
            pairs = await notes.read_entries(want, int(min(left, KEEPALIVE_S) * 1000) or 1)
            foreign = [n for _, n in pairs if not _mine(n, call.agent, key)]
            if foreign:
                await notes.ack(foreign)  # not this key's to see: its group's only
            for entry, notice in pairs:
                if _mine(notice, call.agent, key):
                    sent += 1
                    quiet_since = clock.monotonic()
                    yield event(entry, notice)
            if not pairs:
                yield b": keepalive\n\n"
    except Unavailable as e:
        problem = problems.from_error(e).problem()
        yield b"event: error\ndata: " + problems.encode(problem) + b"\n\n"


def _mine(notice: Notice, agent: str, key: ApiKey) -> bool:
    return notice.agent == agent and key.allows(notice.agent, notice.channel)


async def stream(call: Call) -> StreamingResponse:
    """Follow the agent's notices on `source` as server-sent events: a consumer's
    unacknowledged notices first, then new ones as they come. Reconnect with
    Last-Event-ID to acknowledge what was handled."""
    q: m.NotifyQuery = call.query
    notes = _consumer(call, q.source, q.group, q.consumer)
    last = call.request.headers.get("last-event-id") or q.last_event_id
    if last:
        await notes.ack_through(entry_id(last))
    return StreamingResponse(
        _events(call, notes, q), media_type="text/event-stream", headers=HEADERS
    )


async def ack(call: Call) -> m.Acked:
    """Acknowledge a consumer's notices up to and including `through`."""
    b: m.AckIn = call.body
    notes = _consumer(call, b.source, b.group, b.consumer)
    return m.Acked(acked=await notes.ack_through(entry_id(b.through)))
