"""Encoding and decoding of stream entries, with the size cap checked before decoding."""

from __future__ import annotations

import datetime as dt
import operator
import re
from itertools import accumulate
from typing import Final

import msgspec

from contextlog.schema import blocks, search
from contextlog.schema.errors import EventRejected, EventTooLarge
from contextlog.schema.events import (
    NAMES_OF,
    AnyEvent,
    EraseRequested,
    Event,
    FrameSet,
    MessageImported,
    MessagePosted,
    SearchRequested,
    SessionImported,
    SessionsExpired,
)

ENTRY_FIELD: Final = b"e"
DEFAULT_MAX_ENTRY_BYTES: Final = 256 * 1024
# JSON nesting an entry may have (the event, its content, a block, a tool's input...).
# Decoders recurse, so without a bound a deep entry raises RecursionError at a depth that
# depends on the caller's stack: accepted by a producer, fatal to ingest.
MAX_NESTING: Final = 64
# Times an event may carry: Python's datetime, Postgres and every sum ingest does with
# them (last activity + idle timeout) stay in range, and a clock gone wrong is caught.
EARLIEST: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST: Final = dt.datetime(2100, 1, 1, tzinfo=dt.UTC)

# Reasons recorded with rejected entries (dead letters and their counters).
OVERSIZED: Final = "oversized"
MALFORMED: Final = "malformed"
UNKNOWN_TYPE: Final = "unknown_type"
INVALID: Final = "invalid"

# An escaped NUL (\u0000) preceded by an even number of backslashes: the string holds
# U+0000, which Postgres jsonb refuses. JSON must escape it, so the raw bytes tell.
_NUL_ESCAPE: Final = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
_decoder: Final = msgspec.json.Decoder(AnyEvent)
_encoder: Final = msgspec.json.Encoder()
# Nesting depth, computed on the bytes: strings removed, brackets as +1 / -1.
_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_STEP: Final = [1 if b in b"[{" else -1 for b in range(256)]


def encode(event: Event) -> bytes:
    """The JSON bytes that go into a stream entry's `e` field."""
    return _encoder.encode(event)


def decode(
    data: bytes, max_bytes: int = DEFAULT_MAX_ENTRY_BYTES, *, check: bool = True
) -> AnyEvent:
    """Decode and validate one entry payload, or raise `EventRejected` with a reason.

    The one gate for untrusted input: producers, `contextlog import` and ingest all call
    it, so whatever ingest would refuse is refused at the edge too. No other exception
    escapes it. `check=False` skips the rules that came after an event was stored, for
    reading back the log (old entries keep working).
    """
    if len(data) > max_bytes:
        raise EventTooLarge(OVERSIZED, f"entry is {len(data)} bytes, the cap is {max_bytes}")
    _check_nesting(data)
    try:
        event: AnyEvent = _decoder.decode(data)
    except msgspec.ValidationError as e:
        raise EventRejected(_classify(str(e)), str(e)) from e
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise EventRejected(MALFORMED, f"not valid UTF-8 JSON: {e}") from e
    except Exception as e:
        # Deliberately broad: this decodes bytes anyone could have written, and one entry
        # must never stop ingestion; whatever the decoder raises is that entry's fault.
        raise EventRejected(MALFORMED, f"cannot be decoded: {type(e).__name__}: {e}") from e
    if not check:
        return event
    if b"\\u0000" in data and _NUL_ESCAPE.search(data):
        raise EventRejected(INVALID, "strings must not contain the NUL character (U+0000)")
    _check_semantics(event)
    return event


def nesting(data: bytes) -> int:
    """How deep the JSON in `data` nests (brackets inside strings do not count)."""
    skeleton = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, skeleton)), default=0)


def _check_nesting(data: bytes) -> None:
    if data.count(b"[") + data.count(b"{") <= MAX_NESTING:
        return  # cannot nest deeper than it has brackets: no scan (the common case)
    depth = nesting(data)
    if depth > MAX_NESTING:
        raise EventRejected(
            INVALID, f"JSON nests {depth} levels deep; at most {MAX_NESTING} are allowed"
        )


def decode_fields(fields: dict[bytes, bytes], max_bytes: int = DEFAULT_MAX_ENTRY_BYTES) -> AnyEvent:
    """Decode a raw stream entry (its field map); an entry without `e` is malformed."""
    data = fields.get(ENTRY_FIELD)
    if data is None:
        names = sorted(k.decode("utf-8", "replace") for k in fields)
        raise EventRejected(MALFORMED, f"entry has no 'e' field (fields: {names})")
    return decode(data, max_bytes)


def _classify(message: str) -> str:
    if "`$.type`" in message or "required field `type`" in message:
        return UNKNOWN_TYPE
    return INVALID


_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
# Each event type's names, read in one call (attrgetter of two or more fields: a tuple).
_NAMES: Final = {cls: operator.attrgetter(*fields) for cls, fields in NAMES_OF.items()}


def has_control(name: str) -> bool:
    """Whether `name` holds a control character (U+0000-U+001F, U+007F), which names
    (agent, channel, thread, ...) must not; other unprintable characters are allowed."""
    return _CONTROL.search(name) is not None


def _check_names(event: AnyEvent) -> None:
    """Names (agent, channel, thread, ...) must not hold control characters.

    All of an event's names are looked at as one string. Control characters are not
    printable, so a printable string passes at once; `has_control` decides the rest."""
    joined = "".join(filter(None, _NAMES[type(event)](event)))
    if joined.isprintable() or not has_control(joined):
        return
    fields = NAMES_OF[type(event)]
    bad = next(f for f in fields if has_control(getattr(event, f) or ""))
    raise EventRejected(INVALID, f"control characters are not allowed - at `$.{bad}`")


def _check_times(event: AnyEvent) -> None:
    """Every time an event carries lies in [EARLIEST, LATEST)."""
    _check_time("occurred_at", event.occurred_at)
    if isinstance(event, MessageImported):
        _check_time("original_at", event.original_at)
    elif isinstance(event, SessionImported):
        _check_time("created_at", event.created_at)
    elif isinstance(event, SessionsExpired):
        _check_time("before", event.before)


def _check_time(name: str, at: dt.datetime | None) -> None:
    if at is not None and not EARLIEST <= at < LATEST:
        raise EventRejected(
            INVALID,
            f"{name} must be from {EARLIEST:%Y-%m-%d} to before {LATEST:%Y-%m-%d} (UTC),"
            f" got {at.isoformat()} - at `$.{name}`",
        )


def _check_erase(event: EraseRequested) -> None:
    if event.shard >= event.shards:
        raise EventRejected(INVALID, f"shard {event.shard} of {event.shards} - at `$.shard`")
    if (event.scope == "session") != (event.session is not None):
        raise EventRejected(
            INVALID, "a session's erase names the session, no other does - at `$.session`"
        )


def _check_semantics(event: AnyEvent) -> None:
    """Rules msgspec's type system cannot say: names without control characters, times
    in range, and each content block valid for its type (`schema.blocks`)."""
    _check_names(event)
    _check_times(event)
    if event.erased is not None:
        raise EventRejected(INVALID, "`erased` is written by ingest only - at `$.erased`")
    if isinstance(event, SearchRequested) and (why := search.check(event.query)):
        raise EventRejected(INVALID, f"{why} - at `$.query`")
    if isinstance(event, EraseRequested):
        _check_erase(event)
    try:
        if isinstance(event, FrameSet):
            blocks.check_frame(event.system, event.tools)
            return
        if not isinstance(event, MessagePosted | MessageImported):
            return
        if event.role == "system":
            blocks.check_system(event.content)
        elif not isinstance(event.content, str):
            blocks.check_all(event.content)
    except blocks.BlockError as e:
        raise EventRejected(INVALID, str(e)) from e
