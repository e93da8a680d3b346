"""Encoding and decoding of stream entries, with the size cap checked before decoding."""

from __future__ import annotations

import datetime as dt
import operator
import re
import unicodedata
from itertools import accumulate
from typing import Final

import msgspec

from contextlog.schema import blocks, search
from contextlog.schema.errors import EventRejected, EventTooLarge
from contextlog.schema.events import (
    NAMES_OF,
    AnyEvent,
    Configured,
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
FORGED: Final = "forged"  # a result only workers emit, without a worker's signature

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


# Unicode categories a name must not hold, and what to call them: controls (Cc: C0, DEL,
# C1 such as U+0085 NEXT LINE), format characters (Cf: invisible ones such as U+200B
# ZERO WIDTH SPACE, bidi overrides such as U+202E), line and paragraph separators (Zl
# U+2028, Zp U+2029). With them two different names print alike (`my\u200bbot`, `mybot`)
# or one prints as another (`\u202etobym`), and a name can break a log or a table line.
REFUSED_IN_NAMES: Final = {
    "Cc": "control",
    "Cf": "format (invisible)",
    "Zl": "line separator",
    "Zp": "paragraph separator",
}
# Each event type's names, read in one call (attrgetter of two or more fields: a tuple).
_NAMES: Final = {cls: operator.attrgetter(*fields) for cls, fields in NAMES_OF.items()}


def refused_in_name(name: str) -> str | None:
    """The first character of `name` that a name must not hold (`REFUSED_IN_NAMES`), if
    any. None of those characters is printable, so a printable name passes at once
    (other unprintable characters, such as a no-break space, are allowed)."""
    if name.isprintable():
        return None
    return next((c for c in name if unicodedata.category(c) in REFUSED_IN_NAMES), None)


def _name_refused(char: str, where: str) -> EventRejected:
    kind = REFUSED_IN_NAMES[unicodedata.category(char)]
    return EventRejected(
        INVALID,
        f"names must not hold control, format or separator characters; "
        f"U+{ord(char):04X} ({unicodedata.name(char, 'unnamed')}) is a {kind} "
        f"character - {where}",
    )


def check_names(**names: str | None) -> None:
    """A read's names (agent, channel, thread) by the rule of the events' names: a name no
    event can hold is refused (`EventRejected`) rather than looked up."""
    for field, name in names.items():
        if name is not None and (char := refused_in_name(name)) is not None:
            raise _name_refused(char, f"in `{field}`")


def _check_names(event: AnyEvent) -> None:
    """Names (agent, channel, thread, ...) must not hold control, format or separator
    characters (`refused_in_name`). All of an event's names are looked at as one string
    first: the common case passes in one call."""
    joined = "".join(filter(None, _NAMES[type(event)](event)))
    if refused_in_name(joined) is None:
        return
    for field in NAMES_OF[type(event)]:
        if (char := refused_in_name(getattr(event, field) or "")) is not None:
            raise _name_refused(char, f"at `$.{field}`")


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
    """Rules msgspec's type system cannot say: names without control, format or separator
    characters, times in range, and each content block valid for its type
    (`schema.blocks`)."""
    _check_names(event)
    _check_times(event)
    if isinstance(event, Configured) and event.rolling_window == 0:
        # Unlike the idle timeout's 0 (never), a window of 0 s would hold no message at
        # all, for ever: refused, as CONTEXTLOG_ROLLING_WINDOW=0 is.
        raise EventRejected(
            INVALID,
            "rolling_window must be at least 1 second (0 would leave every context empty; "
            "to forget the history, clear it) - at `$.rolling_window`",
        )
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
