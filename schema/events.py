"""The event contract: every entry on a `contextlog:in:{shard}` stream is one of these.

Each event is a frozen msgspec Struct tagged with an explicit, versioned `type`
(`"message.v1"`). New fields always get defaults; a type never changes; a breaking
change is a new tag. Every string and list is bounded so a hostile entry cannot make
the decoder allocate without limit.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Final, Literal, TypeAlias, get_args

import msgspec
from msgspec import Meta, Struct

from contextlog.schema import blocks
from contextlog.schema.blocks import MAX_BLOCKS

# Bounds. Names and ids are short, free text is capped well below the entry-size cap: the
# same bounds as the content blocks', named here too for the events' users.
MAX_NAME = blocks.MAX_NAME
MAX_TEXT = blocks.MAX_TEXT
Name = blocks.Name
Text = blocks.Text
MAX_SESSION_ID = 80
MAX_DESCRIPTION = 500
MAX_DURATION_S = 366 * 86400
MAX_TOKEN_BUDGET = 10_000_000

# Names exclude control characters: checked once per event by `codec.decode` (NAME_FIELDS),
# not with a msgspec `pattern`, which runs Python's re per field and was most of the
# cost of decoding. Free text may hold anything but U+0000, which
# Postgres jsonb refuses; that rule is checked on the raw JSON by `codec.decode`, because
# msgspec 0.22 crashes in GC when a string with both max_length and pattern sits in a
# union with a list of structs (msgspec issue #717), which `Content` is.
NAME_FIELDS = (
    "agent",
    "channel",
    "thread",
    "source",
    "sender",
    "external_id",
    "provider",
    "model",
    "session_id",
)

SessionRef = Annotated[str, Meta(min_length=1, max_length=MAX_SESSION_ID)]
Description = Annotated[str, Meta(max_length=MAX_DESCRIPTION)]
Seconds = Annotated[int, Meta(ge=0, le=MAX_DURATION_S)]
# "system": a mid-conversation system message (the Messages API takes them in `messages`
# on the newer models), returned in place; its blocks are text (`codec` checks them).
Role = Literal["user", "assistant", "system"]
MAX_TOOLS = 1000


# A `Raw` field's absent value (JSON null): msgspec takes no `Raw` in a union. Fields
# default to it through `absent()` (a factory: the JSON Schema then gives no default,
# which msgspec cannot write for a `Raw`).
NULL: Final = msgspec.Raw(b"null")


def _null() -> msgspec.Raw:
    return NULL


absent: Final = msgspec.field(default_factory=_null)


def given(raw: msgspec.Raw) -> bool:
    """Whether a `Raw` field holds a value (not `NULL`)."""
    return bytes(raw).strip() != b"null"


# Content blocks: every type the Messages API takes, each kept as the raw JSON the adapter
# posted (see `schema.blocks`; `codec.decode` checks each one by its type). `message.v1`
# was widened in place rather than given a new tag: every entry valid before is valid
# now and means the same (its text, tool_use and tool_result blocks are checked as
# before), the log stores each entry's bytes as posted, and every read model selects
# `kind = 'message.v1'`, which a new tag would have split in two.
TextBlock = blocks.TextBlock
ToolUseBlock = blocks.ToolUseBlock
ToolResultBlock = blocks.ToolResultBlock
Content: TypeAlias = Text | Annotated[list[msgspec.Raw], Meta(min_length=1, max_length=MAX_BLOCKS)]


Sha256 = Annotated[str, Meta(pattern="^[0-9a-f]{64}$")]  # a hash in lowercase hex


class ErasedMark(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What ingest writes into an event it redacted (an `erase.v1` did): never a producer.
    `session_id`: on a save or import, the session it created, so a replay of the redacted
    log gives that session the id it had (the id was derived from what is now erased)."""

    erase_id: uuid.UUID
    session_id: SessionRef | None = None


class Event(Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    """Fields every event carries: identity, conversation key, provenance, time."""

    event_id: uuid.UUID
    agent: Name
    channel: Name
    thread: Name | None = None
    source: Name | None = None
    sender: Name | None = None
    occurred_at: Annotated[dt.datetime, Meta(tz=True)]
    # Set only by ingest when it redacts a stored event in place (`erase.v1`); an entry
    # that carries it is refused (`codec.decode`).
    erased: ErasedMark | None = None


class MessagePosted(Event, frozen=True, kw_only=True, tag="message.v1"):
    """A user, assistant or (mid-conversation) system message in a conversation."""

    role: Role
    content: Content
    external_id: Name | None = None


class ContextCleared(Event, frozen=True, kw_only=True, tag="clear.v1"):
    """`/context clear`: the window starts afresh; the log keeps the old messages."""


class SessionSaveRequested(Event, frozen=True, kw_only=True, tag="save.v1"):
    """`/context save [description]`: snapshot the current window as a session."""

    description: Description | None = None
    provider: Name | None = None
    model: Name | None = None
    auto: bool = False  # an idle-timeout save, not a user's command


class SessionRestoreRequested(Event, frozen=True, kw_only=True, tag="restore.v1"):
    """`/context restore <id|last>`: replace the window with a saved session."""

    session_id: SessionRef


class SessionDeleteRequested(Event, frozen=True, kw_only=True, tag="delete_session.v1"):
    """Hide one saved session of this conversation."""

    session_id: SessionRef


class SessionsPurgeRequested(Event, frozen=True, kw_only=True, tag="purge_sessions.v1"):
    """Hide all but the newest `keep` saved sessions of this conversation."""

    keep: Annotated[int, Meta(ge=0, le=1_000_000)]


class Configured(Event, frozen=True, kw_only=True, tag="configure.v1"):
    """Change per-conversation settings; a field left as None keeps its value."""

    rolling_window: Seconds | None = None
    idle_timeout: Seconds | None = None
    token_budget: Annotated[int, Meta(ge=1, le=MAX_TOKEN_BUDGET)] | None = None


class SummaryGenerated(Event, frozen=True, kw_only=True, tag="summary.v1"):
    """A saved session's summary, written by a `summaries` job."""

    session_id: SessionRef
    summary: Text
    local: bool = False  # made by the local summarizer (no ANTHROPIC_API_KEY)
    failed: bool = False  # the API kept failing; `summary` says so
    # Which summary of the session this is: an erase that touched the session's messages
    # asks for a new one (round + 1); a summary of an older round no longer applies.
    round: Annotated[int, Meta(ge=0)] = 0


class ContextCompacted(Event, frozen=True, kw_only=True, tag="compaction.v1"):
    """The oldest part of a thread's window, seq <= `through_seq`, replaced by a summary."""

    through_seq: Annotated[int, Meta(ge=0)]  # 0: nothing compacted, tokens re-counted
    # The conversation's cleared_seq when the job read the window: if a clear or
    # restore came since, the compaction no longer applies and is ignored.
    base_seq: Annotated[int, Meta(ge=0)] = 0
    seen_seq: Annotated[int, Meta(ge=0)] = 0  # the newest message the job read
    remaining_tokens: Annotated[int, Meta(ge=0)] = 0  # of the window after the cut
    summary: Text = ""
    local: bool = False
    # The Messages API's own compaction block (on-demand compaction), kept verbatim: the
    # thread's context then starts with it, and the messages after `through_seq` follow
    # it unchanged. None: `summary` is ours (a boundary).
    block: msgspec.Raw = absent
    # The thread's boundary count when the job read it: a boundary since (a clear, a
    # cut, another compaction) makes this compaction moot. None: an event written before
    # boundaries were counted (`base_seq` decides).
    boundaries: Annotated[int, Meta(ge=0)] | None = None


class FrameSet(Event, frozen=True, kw_only=True, tag="frame.v1"):
    """The bot's own request frame for this conversation: its model, top-level `system`
    and `tools` and its `thinking` setting, each kept as posted. The worker's compaction
    requests use it; a change of `system` or `tools` is a boundary (thinking produced
    under the old frame no longer matches its prefix, so it is removed from the turns
    kept)."""

    model: Name
    system: Content | None = None
    tools: Annotated[list[msgspec.Raw], Meta(max_length=MAX_TOOLS)] | None = None
    # The `thinking` request parameter it sends, a JSON object; NULL: none (a `Raw` cannot
    # be in a union, so JSON null stands for absent).
    thinking: msgspec.Raw = absent


class MessageImported(Event, frozen=True, kw_only=True, tag="imported_message.v1"):
    """A message of an imported session: in the log, but never in a live window."""

    import_id: uuid.UUID
    role: Role
    content: Content
    original_at: Annotated[dt.datetime, Meta(tz=True)] | None = None


class SessionImported(Event, frozen=True, kw_only=True, tag="session_imported.v1"):
    """Creates a session from the `imported_message.v1` events of `import_id`."""

    import_id: uuid.UUID
    session_id: SessionRef  # the id it had where it was exported; kept when free
    message_count: Annotated[int, Meta(ge=1, le=1_000_000)]
    description: Description | None = None
    summary: Text | None = None
    created_at: Annotated[dt.datetime, Meta(tz=True)] | None = None
    auto: bool = False
    summary_local: bool = False  # the summary came from the local summarizer


MAX_QUERY = 500
MAX_PAGE = 1000
MAX_KEEP_DAYS = 36_500  # a hundred years


class SearchRequested(Event, frozen=True, kw_only=True, tag="search.v1"):
    """`/context search <query>`: look through this conversation's log; the matches come
    back as a `search_results` notice (the query syntax: `producers.search`)."""

    query: Annotated[str, Meta(min_length=1, max_length=MAX_QUERY)]
    page: Annotated[int, Meta(ge=1, le=MAX_PAGE)] = 1


EraseScope = Literal["conversation", "sender", "session"]


class EraseRequested(Event, frozen=True, kw_only=True, tag="erase.v1"):
    """Erase a subject's content from the log, its projections, search and Redis.

    It holds no personal data beyond the subject's identity, hashed (`schema.erasure`):
    `subject` is the hash of the conversation's channel (scopes `conversation` and
    `session`) or of the sender (`sender`), `session` the hash of the session id. One
    erase request is one event per shard (`shard` of `shards`), each on a conversation of
    its own on that shard (`erasure.erase_channel`), so each shard's ingest applies it in
    that shard's stream order: every entry before it, in flight or not, is covered, and no
    shard writes another's conversations. Operator-only (`OPERATOR_ONLY`)."""

    erase_id: uuid.UUID
    scope: EraseScope
    subject: Sha256
    session: Sha256 | None = None
    shard: Annotated[int, Meta(ge=0, lt=1024)]
    shards: Annotated[int, Meta(ge=1, le=1024)]


class RetentionSet(Event, frozen=True, kw_only=True, tag="retention.v1"):
    """This conversation's retention, overriding its agent's policy: keep the log this many
    days after the last activity, saved sessions this many days after they were saved.
    None keeps the current value; 0 goes back to the agent's policy."""

    keep_log_days: Annotated[int, Meta(ge=0, le=MAX_KEEP_DAYS)] | None = None
    keep_sessions_days: Annotated[int, Meta(ge=0, le=MAX_KEEP_DAYS)] | None = None


class SessionsExpired(Event, frozen=True, kw_only=True, tag="expire_sessions.v1"):
    """The retention job's: this conversation's sessions saved before `before` are removed
    (row, description, preview and summary), as their retention policy says."""

    before: Annotated[dt.datetime, Meta(tz=True)]


AnyEvent: TypeAlias = (
    MessagePosted
    | ContextCleared
    | SessionSaveRequested
    | SessionRestoreRequested
    | SessionDeleteRequested
    | SessionsPurgeRequested
    | Configured
    | FrameSet
    | SummaryGenerated
    | ContextCompacted
    | MessageImported
    | SessionImported
    | SearchRequested
    | EraseRequested
    | RetentionSet
    | SessionsExpired
)

# The same types, in the union's order (one list: `AnyEvent`).
EVENT_TYPES: tuple[type[Event], ...] = get_args(AnyEvent)

# Events a worker or an operator emits, never an adapter: today ingest takes them from any
# producer on the inbound streams (the trust work, issue 30, authenticates them: whatever
# gates a worker's results gates these with them). The retention job emits
# `expire_sessions.v1`; `contextlog erase` and `Producer.erase` emit `erase.v1`.
OPERATOR_ONLY: tuple[type[Event], ...] = (EraseRequested, SessionsExpired)


# The events that carry a message's content (a string or content blocks).
MESSAGES: tuple[type[MessagePosted], type[MessageImported]] = (MessagePosted, MessageImported)

TAGS: dict[type, str] = {cls: str(cls.__struct_config__.tag) for cls in EVENT_TYPES}
# The name fields each event type has: checked for control characters on every decode.
NAMES_OF: dict[type, tuple[str, ...]] = {
    cls: tuple(f for f in NAME_FIELDS if f in cls.__struct_fields__) for cls in EVENT_TYPES
}


def kind_of(event: Event) -> str:
    """The versioned tag of an event, as stored in the log's `kind` column."""
    return TAGS[type(event)]
