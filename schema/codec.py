"""Encoding and decoding of stream entries, with the size cap checked before decoding."""

from __future__ import annotations

import re
from typing import Final

import msgspec

from schema.errors import EventRejected, EventTooLarge
from schema.events import NAMES_OF, AnyEvent, Event, MessageImported, MessagePosted, ToolUseBlock

ENTRY_FIELD: Final = b"e"
DEFAULT_MAX_ENTRY_BYTES: Final = 256 * 1024

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


def encode(event: Event) -> bytes:
    """The JSON bytes that go into a stream entry's `e` field."""
    return _encoder.encode(event)


def decode(data: bytes, max_bytes: int = DEFAULT_MAX_ENTRY_BYTES) -> AnyEvent:
    """Decode and validate one entry payload, or raise `EventRejected` with a reason."""
    if len(data) > max_bytes:
        raise EventTooLarge(OVERSIZED, f"entry is {len(data)} bytes, the cap is {max_bytes}")
    try:
        event: AnyEvent = _decoder.decode(data)
    except msgspec.ValidationError as e:
        raise EventRejected(_classify(str(e)), str(e)) from e
    except msgspec.DecodeError as e:
        raise EventRejected(MALFORMED, str(e)) from e
    if b"\\u0000" in data and _NUL_ESCAPE.search(data):
        raise EventRejected(INVALID, "strings must not contain the NUL character (U+0000)")
    _check_semantics(event)
    return event


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


def _check_names(event: AnyEvent) -> None:
    """Names (agent, channel, thread, ...) must not hold control characters."""
    fields = NAMES_OF[type(event)]
    if not _CONTROL.search("".join([getattr(event, f) or "" for f in fields])):
        return
    bad = next(f for f in fields if _CONTROL.search(getattr(event, f) or ""))
    raise EventRejected(INVALID, f"control characters are not allowed - at `$.{bad}`")


def _check_semantics(event: AnyEvent) -> None:
    """Rules msgspec's type system cannot say: names without control characters, and a
    tool's input must be a JSON object."""
    _check_names(event)
    if not isinstance(event, MessagePosted | MessageImported) or isinstance(event.content, str):
        return
    for i, block in enumerate(event.content):
        if isinstance(block, ToolUseBlock) and bytes(block.input).lstrip()[:1] != b"{":
            raise EventRejected(
                INVALID, f"tool_use input must be a JSON object - at `$.content[{i}].input`"
            )
