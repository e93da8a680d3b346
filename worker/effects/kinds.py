"""What a batch asks to be done outside Postgres once it has committed: a typed union.

Handlers and the append return them, the outbox keeps the durable ones in the batch's
transaction (`effects` table: the tag as `kind`, the fields as `body`) and the relay
sends them. Compaction triggers and timer arms are not kept: the next batch of the
conversation asks again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Final

import msgspec


class Notice(msgspec.Struct, frozen=True, tag="notice"):
    """A notice for an adapter's outbound stream (the notice as its wire JSON)."""

    source: str
    notice: str


class Summarize(msgspec.Struct, frozen=True, tag="summarize"):
    """Queue the summary of a saved session (`round`: its summary round, see 017)."""

    agent: str
    channel: str
    session_id: str
    round: int = 0


class Compact(msgspec.Struct, frozen=True, tag="compact"):
    """Queue a compaction of the conversation (its window passed the threshold)."""

    agent: str
    channel: str


class Arm(msgspec.Struct, frozen=True, tag="arm"):
    """Arm the conversation's idle timer for `due`."""

    agent: str
    channel: str
    due: dt.datetime


class Scrub(msgspec.Struct, frozen=True, tag="scrub"):
    """After an erase committed: take what Redis still holds of it out (`effects.scrub`):
    entries of the shard's inbound stream before the erase and its dead letters that are
    the subject's, notices about what was erased, attachment bytes, job records."""

    agent: str
    shard: int
    erase_event: str  # the erase's event id: its inbound entry bounds what is scrubbed
    scope: str
    subject: str  # the subject's hash (schema.erasure.subject_hash)
    dropped: list[str] = []  # conversations dropped whole
    channels: list[str] = []  # conversations dropped or redacted in
    event_ids: list[str] = []  # the events redacted or dropped
    sessions: list[list[str]] = []  # [channel, session id] of the sessions touched
    hashes: list[str] = []  # attachments deleted (sha256, hex)


Effect = Notice | Summarize | Compact | Arm | Scrub
UNKEPT: Final = (Compact, Arm)  # effects a later batch asks for again


def durable(effects: Sequence[Effect]) -> list[Effect]:
    """The effects a crash must not lose."""
    return [x for x in effects if not isinstance(x, UNKEPT)]


def to_rows(effects: Sequence[Effect]) -> bytes:
    """The `insert_effects` rows: [{"kind": tag, "body": fields}, ...] as JSON."""
    rows = []
    for x in effects:
        body = msgspec.to_builtins(x)
        rows.append({"kind": body.pop("type"), "body": body})
    return msgspec.json.encode(rows)


def from_row(kind: str, body: dict[str, Any]) -> Effect:
    """An effect kept by `to_rows` (also by versions before this union: same shape)."""
    effect: Effect = msgspec.convert({**body, "type": kind}, Effect)
    return effect
