"""The notification contract: every entry on a `contextlog:out:{source}` stream is a `Notice`.

Delivery is at least once, so consumers dedupe on `notice_id`. `kind` is a plain string,
not a Literal, so an adapter built against an older contract still reads newer kinds (and
can ignore them). New fields always get defaults; a breaking change is a new entry field.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Final

import msgspec
from msgspec import Meta

from contextlog.schema.blocks import MAX_NAME, MAX_TEXT
from contextlog.schema.errors import EventRejected, EventTooLarge

ENTRY_FIELD: Final = "n"
DEFAULT_MAX_NOTICE_BYTES: Final = 1024 * 1024

# Kinds the worker publishes today.
SESSION_SAVED: Final = "session_saved"
SUMMARY_READY: Final = "summary_ready"
RESTORE_DONE: Final = "restore_done"
COMMAND_REFUSED: Final = "command_refused"
SESSION_DELETED: Final = "session_deleted"
SESSIONS_PURGED: Final = "sessions_purged"
CONTEXT_COMPACTED: Final = "context_compacted"
SESSION_IMPORTED: Final = "session_imported"
SEARCH_RESULTS: Final = "search_results"
ERASE_DONE: Final = "erase_done"
KINDS: Final = frozenset(
    {
        SESSION_SAVED,
        SUMMARY_READY,
        RESTORE_DONE,
        COMMAND_REFUSED,
        SESSION_DELETED,
        SESSIONS_PURGED,
        CONTEXT_COMPACTED,
        SESSION_IMPORTED,
        SEARCH_RESULTS,
        ERASE_DONE,
    }
)

# Reasons carried by `EventRejected` when an entry is not a notice.
OVERSIZED: Final = "oversized"
MALFORMED: Final = "malformed"
INVALID: Final = "invalid"

# Bounds, so a hostile entry cannot make the decoder allocate without limit: the event
# contract's (schema.blocks), a name's and a text's.
_Name = Annotated[str, Meta(min_length=1, max_length=MAX_NAME)]
_Text = Annotated[str, Meta(max_length=MAX_TEXT)]
_Aware = Annotated[dt.datetime, Meta(tz=True)]


MAX_HITS: Final = 50


class NoticeHit(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One message a `/context search` found (see `producers.search.SearchHit`)."""

    channel: _Name
    thread: _Name | None = None
    seq: Annotated[int, Meta(ge=1)]
    event_id: _Name
    at: _Aware
    sender: _Name | None = None
    role: _Name
    snippet: _Text
    sessions: Annotated[list[_Name], Meta(max_length=1000)] = []


class Notice(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One notification for an adapter: something happened in one of its conversations."""

    notice_id: _Name
    kind: _Name
    agent: _Name
    channel: _Name
    occurred_at: _Aware
    thread: _Name | None = None
    session_id: _Name | None = None
    # The summary for summary_ready, the reason for command_refused, a line for people
    # otherwise.
    text: _Text | None = None
    event_id: _Name | None = None  # the command event that caused this notice
    auto: bool = False
    local: bool = False  # the summary was made by the local summarizer
    failed: bool = False  # summary generation failed
    # search_results: one page of matches, best first; `total` matches ranked (at most
    # the newest 1,000), this is page `page`.
    hits: Annotated[list[NoticeHit], Meta(max_length=MAX_HITS)] | None = None
    total: Annotated[int, Meta(ge=0)] | None = None
    page: Annotated[int, Meta(ge=1)] | None = None


_decoder: Final = msgspec.json.Decoder(Notice)
_encoder: Final = msgspec.json.Encoder()


def encode(notice: Notice) -> bytes:
    """The JSON bytes of an entry's `n` field; a notice its readers would refuse raises
    `EventRejected` here, at the publisher, rather than being skipped by every adapter."""
    data = _encoder.encode(notice)
    decode(data)  # msgspec checks constraints only when decoding; notices are few
    return data


def decode(data: bytes, max_bytes: int = DEFAULT_MAX_NOTICE_BYTES) -> Notice:
    """Decode and validate one entry payload, or raise `EventRejected` with a reason."""
    if len(data) > max_bytes:
        raise EventTooLarge(OVERSIZED, f"notice is {len(data)} bytes, the cap is {max_bytes}")
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError as e:
        raise EventRejected(INVALID, str(e)) from e
    except msgspec.DecodeError as e:
        raise EventRejected(MALFORMED, str(e)) from e
