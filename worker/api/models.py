"""The HTTP API's wire types: msgspec Structs, from which the OpenAPI document is generated.

Content blocks are opaque JSON (`msgspec.Raw`): they reach the log byte for byte as posted,
and the library's contract (`schema.codec.decode`) decides what is valid, exactly as for a
Python adapter. Roles, likewise, pass through to the library, which says which it takes.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from contextlog.producers.context import Boundary, Context
from contextlog.producers.history import SessionInfo
from contextlog.producers.search import SearchHit
from contextlog.schema import events as ev
from contextlog.schema import notices as nt
from contextlog.worker.tasks.webhooks import Delivery

_NAME_DOC = "1-200 characters, no control, format or separator characters"
Name = Annotated[str, Meta(min_length=1, max_length=200, description=_NAME_DOC)]
Aware = Annotated[dt.datetime, Meta(tz=True)]
Block = Annotated[
    msgspec.Raw,
    Meta(
        extra_json_schema={
            "type": "object",
            "additionalProperties": True,
            "description": "an Anthropic content block",
        }
    ),
]
Blocks = Annotated[list[Block], Meta(min_length=1)]
Json = Annotated[
    dict[str, Any], Meta(extra_json_schema={"type": "object", "additionalProperties": True})
]
Message = Annotated[
    dict[str, Any],
    Meta(
        extra_json_schema={
            "type": "object",
            "description": "an Anthropic MessageParam",
            "required": ["role", "content"],
            "additionalProperties": True,
            "properties": {
                "role": {"type": "string"},
                "content": {
                    "type": "array",
                    "items": {"type": "object", "additionalProperties": True},
                },
            },
        }
    ),
]
Right = Literal["post", "read", "sessions", "admin"]


class _Common(Struct, kw_only=True, forbid_unknown_fields=True):
    """What every posted message or command may say besides its own fields. With
    `external_id` (or an Idempotency-Key header), the event id is derived from
    (`source`, `external_id`): a request sent twice is stored once."""

    thread: Name | None = None
    sender: Name | None = None
    source: Name | None = None
    external_id: Name | None = None
    occurred_at: Aware | None = None


class MessageIn(_Common, kw_only=True):
    """A message: `role` as the library takes it (`user`, `assistant`, ...), `content` a
    string or a list of Anthropic content blocks."""

    role: Annotated[str, Meta(min_length=1, max_length=50)]
    content: str | Blocks


class ClearIn(_Common, kw_only=True):
    """`/context clear`."""


class SaveIn(_Common, kw_only=True):
    """`/context save [description]`."""

    description: Annotated[str, Meta(max_length=500)] | None = None


class RestoreIn(_Common, kw_only=True):
    """`/context restore <id|last>`."""

    session_id: Annotated[str, Meta(min_length=1, max_length=80)]


class PurgeIn(_Common, kw_only=True):
    """Keep only the newest `keep` sessions."""

    keep: Annotated[int, Meta(ge=0, le=1_000_000)]


class FrameIn(_Common, kw_only=True):
    """The bot's own request frame (`Producer.set_frame`): the `model`, and the top-level
    `system`, `tools` and `thinking` it sends with every request, as sent. The worker's
    compactions use it; a changed `system` or `tools` is a boundary (docs/context.md)."""

    model: Annotated[str, Meta(min_length=1, max_length=200)]
    system: str | list[Json] | None = None
    tools: list[Json] | None = None
    thinking: Json | None = None


class RetentionIn(_Common, kw_only=True):
    """This conversation's retention over its agent's policy: keep its log this many days
    after its last activity, its saved sessions this many days after they were saved
    (left out: unchanged; 0: back to the agent's policy)."""

    keep_log_days: Annotated[int, Meta(ge=0, le=ev.MAX_KEEP_DAYS)] | None = None
    keep_sessions_days: Annotated[int, Meta(ge=0, le=ev.MAX_KEEP_DAYS)] | None = None


class SettingsIn(_Common, kw_only=True):
    """Conversation settings to change (seconds; a field left out keeps its value)."""

    rolling_window: Annotated[int, Meta(ge=0)] | None = None
    idle_timeout: Annotated[int, Meta(ge=0)] | None = None
    token_budget: Annotated[int, Meta(ge=1)] | None = None


# Batch items: each single-request body with its conversation and a `type` tag.
class MessageItem(MessageIn, kw_only=True, tag_field="type", tag="message"):
    """A message of a batch."""

    agent: Name
    channel: Name


class ClearItem(ClearIn, kw_only=True, tag_field="type", tag="clear"):
    """A clear of a batch."""

    agent: Name
    channel: Name


class SaveItem(SaveIn, kw_only=True, tag_field="type", tag="save"):
    """A save of a batch."""

    agent: Name
    channel: Name


class RestoreItem(RestoreIn, kw_only=True, tag_field="type", tag="restore"):
    """A restore of a batch."""

    agent: Name
    channel: Name


class DeleteItem(RestoreIn, kw_only=True, tag_field="type", tag="delete_session"):
    """A session deletion of a batch."""

    agent: Name
    channel: Name


class PurgeItem(PurgeIn, kw_only=True, tag_field="type", tag="purge_sessions"):
    """A purge of a batch."""

    agent: Name
    channel: Name


class SettingsItem(SettingsIn, kw_only=True, tag_field="type", tag="configure"):
    """A settings change of a batch."""

    agent: Name
    channel: Name


class FrameItem(FrameIn, kw_only=True, tag_field="type", tag="frame"):
    """A frame registration of a batch."""

    agent: Name
    channel: Name


Item = (
    MessageItem
    | ClearItem
    | SaveItem
    | RestoreItem
    | DeleteItem
    | PurgeItem
    | SettingsItem
    | FrameItem
)


class BatchIn(Struct, kw_only=True, forbid_unknown_fields=True):
    """Messages and commands sent in one round trip, in order. Every item is checked
    before any is sent: one bad item refuses the batch, naming it (`item`)."""

    items: Annotated[list[Item], Meta(min_length=1, max_length=1000)]


class Accepted(Struct, kw_only=True):
    """The event was checked as ingest will check it and queued; `wait_for` it in a
    context read to see it stored."""

    event_id: str


class BatchAccepted(Struct, kw_only=True):
    """The batch's event ids, in item order."""

    event_ids: list[str]


SystemMessages = Annotated[
    Literal["keep", "fold"],
    Meta(
        description="keep: `role: system` messages stay where they were posted; fold: "
        "they become text of the user turn they follow (models that refuse the role)"
    ),
]


class BoundaryOut(Struct, kw_only=True):
    """The last boundary the thread crossed (docs/context.md): between two boundaries
    every read returns the previous read's messages unchanged with new ones at the end."""

    kind: Annotated[
        str, Meta(description="clear, restore, budget, edge, compaction, summary, frame, upgrade")
    ]
    seq: int | None
    count: int

    @classmethod
    def of(cls, b: Boundary | None) -> BoundaryOut | None:
        return None if b is None else cls(kind=b.kind, seq=b.seq, count=b.count)


class ContextOut(Struct, kw_only=True):
    """`ContextReader.context()`'s result: `messages` are ready for `messages.create`.
    `boundary` changes only when the messages stop being an extension of the last read's;
    `thinking_removed` counts thinking blocks such a boundary took out of the kept turns;
    `over_budget`: a tool-use cycle grew past the budget (never cut)."""

    messages: list[Message]
    system: str | None
    token_estimate: int
    truncated: bool
    window_start: Aware | None
    compacted: bool
    served_by: str
    boundary: BoundaryOut | None
    thinking_removed: int
    over_budget: bool
    last_seq: int | None

    @classmethod
    def from_context(cls, ctx: Context) -> ContextOut:
        """The one place a `Context` becomes JSON (new fields are added here)."""
        return cls(
            messages=ctx.messages,
            system=ctx.system,
            token_estimate=ctx.token_estimate,
            truncated=ctx.truncated,
            window_start=ctx.window_start,
            compacted=ctx.compacted,
            served_by=ctx.served_by,
            boundary=BoundaryOut.of(ctx.boundary),
            thinking_removed=ctx.thinking_removed,
            over_budget=ctx.over_budget,
            last_seq=ctx.last_seq,
        )


class RequestIn(Struct, kw_only=True, forbid_unknown_fields=True):
    """`Context.to_anthropic(system=, tools=, cache=)` of one thread's context."""

    thread: Name | None = None
    wait_for: uuid.UUID | None = None
    timeout: Annotated[float, Meta(ge=0, le=30)] = 2.0
    system: str | list[Json] | None = None
    tools: list[Json] | None = None
    cache: bool = False
    system_messages: SystemMessages | None = None


class AnthropicRequest(Struct, kw_only=True, omit_defaults=True):
    """Keyword arguments for `messages.create`, besides `model` and `max_tokens`."""

    messages: list[Message]
    system: str | list[Json] | UnsetType = UNSET
    tools: list[Json] | UnsetType = UNSET


class RequestOut(Struct, kw_only=True):
    """The request, and the context it was made of (its messages left out)."""

    request: AnthropicRequest
    token_estimate: int
    truncated: bool
    compacted: bool
    boundary: BoundaryOut | None
    thinking_removed: int
    over_budget: bool


class TurnIn(MessageIn, kw_only=True):
    """A bot's turn in one request: post this message, wait until it is stored (up to
    `timeout` seconds), and answer the `messages.create` request of its thread, with the
    bot's own `system` and `tools` first (`Context.to_anthropic`)."""

    timeout: Annotated[float, Meta(ge=0, le=30)] = 2.0
    system: str | list[Json] | None = None
    tools: list[Json] | None = None
    cache: bool = False
    system_messages: SystemMessages | None = None


class TurnOut(Struct, kw_only=True):
    """The posted message's event id, and the request of the context that ends with it."""

    event_id: str
    request: AnthropicRequest
    token_estimate: int
    truncated: bool
    compacted: bool
    boundary: BoundaryOut | None
    thinking_removed: int
    over_budget: bool


class ContextQuery(Struct, kw_only=True, forbid_unknown_fields=True):
    """Query of a context read: which thread, and an event to wait for first."""

    thread: Name | None = None
    wait_for: uuid.UUID | None = None
    timeout: Annotated[float, Meta(ge=0, le=30)] = 2.0
    system_messages: SystemMessages | None = None


class SearchQuery(Struct, kw_only=True, forbid_unknown_fields=True):
    """A search of the agent's conversations (`ContextReader.search`): `q` in the syntax of
    README's Search (words, "phrases", prefix*, -word, OR); `channel` narrows it (a key
    scoped to channels must name one)."""

    q: Annotated[str, Meta(min_length=1, max_length=500)]
    channel: Name | None = None
    thread: Name | None = None
    sender: Name | None = None
    since: Aware | None = None
    until: Aware | None = None
    page: Annotated[int, Meta(ge=1, le=1_000_000)] = 1
    per_page: Annotated[int, Meta(ge=1, le=100)] = 10


class SearchOut(Struct, kw_only=True):
    """One page of hits, best first (newest first among equals); `capped`: older matches
    were left out of the ranking (narrow the search)."""

    query: str
    hits: list[SearchHit]
    page: int
    per_page: int
    total: int
    pages: int
    capped: bool


class EraseIn(Struct, kw_only=True, forbid_unknown_fields=True):
    """Erase a conversation (`channel`), one session's messages (`channel` and
    `session_id`), or everything of a sender across the agent's conversations (`sender`),
    as `contextlog erase` does; `source` hears `erase_done` for each erase event."""

    channel: Name | None = None
    sender: Name | None = None
    session_id: Annotated[str, Meta(min_length=1, max_length=80)] | None = None
    source: Name | None = None


class SettingsOut(Struct, kw_only=True):
    """A conversation's settings in force (the deployment's defaults where it set none)."""

    rolling_window: int
    idle_timeout: int
    token_budget: int


class PageQuery(Struct, kw_only=True, forbid_unknown_fields=True):
    """One page of sessions, newest first; `channel` narrows to one conversation."""

    channel: Name | None = None
    page: Annotated[int, Meta(ge=1, le=1_000_000)] = 1
    per_page: Annotated[int, Meta(ge=1, le=100)] = 10


class SessionPageOut(Struct, kw_only=True):
    """A page of sessions, newest first."""

    sessions: list[SessionInfo]
    page: int
    per_page: int
    total: int
    pages: int


class ImportQuery(Struct, kw_only=True, forbid_unknown_fields=True):
    """Where an import's done (or refused) notice goes."""

    source: Name | None = None


class NotifyQuery(Struct, kw_only=True, forbid_unknown_fields=True):
    """Which notification stream to follow, as which consumer. Unacknowledged notices
    come again to the same (`group`, `consumer`); `last_event_id` (or the Last-Event-ID
    header) acknowledges everything up to it. `limit` ends the stream after that many
    notices, `wait` after that many seconds without one (0: never)."""

    source: Name
    group: Name = "adapter"
    consumer: Name = "http"
    last_event_id: Annotated[str, Meta(max_length=40)] | None = None
    limit: Annotated[int, Meta(ge=1, le=100_000)] | None = None
    wait: Annotated[float, Meta(ge=0, le=3600)] = 0


class AckIn(Struct, kw_only=True, forbid_unknown_fields=True):
    """Acknowledge a consumer's notices up to and including the entry `through`."""

    source: Name
    through: Annotated[str, Meta(min_length=3, max_length=40)]
    group: Name = "adapter"
    consumer: Name = "http"


class Acked(Struct, kw_only=True):
    """How many stream entries were acknowledged."""

    acked: int


class Health(Struct, kw_only=True):
    """Whether this process reaches Redis and Postgres."""

    ok: bool
    redis: bool
    postgres: bool


Kind = Annotated[str, Meta(min_length=1, max_length=50, description=", ".join(sorted(nt.KINDS)))]


class WebhookIn(Struct, kw_only=True, forbid_unknown_fields=True):
    """Deliver the notices of `kinds` on `source`'s stream, of these agents (default: the
    key's) and channels (default: all), signed per Standard Webhooks, to `url`."""

    url: Annotated[str, Meta(min_length=8, max_length=2000)]
    source: Name
    kinds: Annotated[list[Kind], Meta(min_length=1, max_length=20)]
    agents: Annotated[list[Name], Meta(min_length=1, max_length=100)] | None = None
    channels: Annotated[list[Name], Meta(min_length=1, max_length=100)] | None = None


class WebhookOut(Struct, kw_only=True, omit_defaults=True):
    """A registered webhook; `secret` (`whsec_...`) is shown when it is created only."""

    webhook_id: str
    url: str
    source: str
    kinds: list[str]
    agents: list[str]
    channels: list[str] | None
    created_at: Aware
    secret: str | UnsetType = UNSET


class WebhookList(Struct, kw_only=True):
    """The webhooks this key may see."""

    webhooks: list[WebhookOut]


class DeliveryList(Struct, kw_only=True):
    """A webhook's deliveries, newest first."""

    deliveries: list[Delivery]


class Replayed(Struct, kw_only=True):
    """The delivery was queued again."""

    delivery_id: str


class DeliveryQuery(Struct, kw_only=True, forbid_unknown_fields=True):
    """Filter of a deliveries listing."""

    status: Literal["pending", "delivered", "failed"] | None = None
    limit: Annotated[int, Meta(ge=1, le=500)] = 50
