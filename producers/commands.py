"""Builds events from adapter calls; one definition serves the sync, async and batch forms."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import msgspec

from contextlog.producers.ids import derived_id, uuid7
from contextlog.schema import attachments, codec, keys, signing
from contextlog.schema import events as ev
from contextlog.schema.defaults import parse_duration as parse_duration  # re-exported
from contextlog.schema.errors import EventRejected, EventTooLarge

R = TypeVar("R")
Duration = int | float | dt.timedelta


def utcnow() -> dt.datetime:
    """The wall clock, timezone-aware: the default `occurred_at` of a new event."""
    return dt.datetime.now(dt.UTC)


class Prepared(msgspec.Struct, frozen=True):
    """An event checked against the contract, ready to XADD."""

    event_id: str
    stream: str
    payload: bytes
    # (Redis key, bytes) of the attachments the entry references: written with it.
    blobs: tuple[tuple[str, bytes], ...] = ()
    # A worker's result: its signature (schema.signing), in the entry beside it.
    signature: bytes | None = None


class Encoder:
    """Encodes an event, checks it as ingest will, and picks its shard stream."""

    def __init__(
        self,
        shards: int,
        max_entry_bytes: int = codec.DEFAULT_MAX_ENTRY_BYTES,
        limits: attachments.Limits | None = None,
        signing_key: signing.Key | None = None,
    ) -> None:
        self.shards = shards
        self.max_entry_bytes = max_entry_bytes
        self.limits = limits or attachments.Limits()
        self.signing_key = signing_key  # a worker's: it may emit results

    def prepare(self, event: ev.Event) -> Prepared:
        """Encode and validate; bad input raises `EventRejected` here, not in a dead letter.
        Base64 image and document data is taken out as attachments (`schema.attachments`).
        A result only workers emit (`signing.is_result`) is signed, or refused without a
        worker's key."""
        if signing.is_result(event) and self.signing_key is None:
            what = "an idle-timeout save" if isinstance(event, ev.SessionSaveRequested) else ""
            erase = isinstance(event, ev.EraseRequested)
            who = "an operator (contextlog erase)" if erase else "contextlog's worker"
            raise EventRejected(
                codec.FORGED,
                f"{what or ev.kind_of(event)} is sent only by {who}, signed with the"
                " deployment's key; a producer without it cannot send it",
            )
        event, blobs = _take_attachments(event, self.limits)
        try:
            payload = codec.encode(event)
        except (TypeError, ValueError) as e:
            raise EventRejected(codec.INVALID, f"cannot encode event: {e}") from e
        except RecursionError as e:
            raise EventRejected(
                codec.INVALID, f"content nests too deeply (at most {codec.MAX_NESTING} levels)"
            ) from e
        if len(payload) > self.max_entry_bytes:
            raise EventTooLarge(
                codec.OVERSIZED, f"event is {len(payload)} bytes, the cap is {self.max_entry_bytes}"
            )
        checked = codec.decode(payload, self.max_entry_bytes)
        shard = keys.shard_of(checked.agent, checked.channel, self.shards)
        stored = tuple((keys.attachment(shard, b.sha256), b.data) for b in blobs)
        signature = None
        if self.signing_key is not None and signing.is_result(checked):
            signature = self.signing_key.sign(payload)
        return Prepared(str(checked.event_id), keys.stream(shard), payload, stored, signature)


def _take_attachments(
    event: ev.Event, limits: attachments.Limits
) -> tuple[ev.Event, list[attachments.Blob]]:
    """The event with its base64 sources replaced by attachment references, and the bytes."""
    if not isinstance(event, ev.MessagePosted | ev.MessageImported) or isinstance(
        event.content, str
    ):
        return event, []
    # Blocks decoded from JSON (an import) are Raw: only those that may hold base64.
    plain = [
        msgspec.json.decode(b) if isinstance(b, msgspec.Raw) and b'"base64"' in bytes(b) else b
        for b in event.content
    ]
    content, blobs = attachments.extract(plain, limits)
    if content is plain and not any(p is not b for p, b in zip(plain, event.content, strict=True)):
        return event, []
    return msgspec.structs.replace(event, content=content), blobs


def _seconds(name: str, value: Duration | None) -> int | None:
    """Whole seconds from a number or a timedelta; anything else is refused, not rounded."""
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise EventRejected(
            codec.INVALID, f"{name} must be seconds (a number) or a timedelta, got {value!r}"
        )
    if not math.isfinite(seconds) or seconds != int(seconds):
        raise EventRejected(codec.INVALID, f"{name} must be whole seconds, got {value!r}")
    return int(seconds)


def _content(content: object) -> str | list[Any]:
    """A message body as the contract takes it: a string or a list of content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, bytes | bytearray):
        return list(content)
    raise EventRejected(
        codec.INVALID,
        f"content must be a string or a list of content blocks, got {type(content).__name__}",
    )


class Commands(ABC, Generic[R]):
    """The producer verbs (docs/architecture.md); `_send` decides what a call returns."""

    clock: Callable[[], dt.datetime] = staticmethod(utcnow)

    @abstractmethod
    def _send(self, event: ev.Event) -> R:
        """Deliver one event (or queue it, in a batch)."""

    def push(self, event: ev.Event) -> R:
        """Send an event built by the caller."""
        return self._send(event)

    def _common(self, agent: str, channel: str, opts: dict[str, Any]) -> dict[str, Any]:
        occurred_at = opts.pop("occurred_at", None) or self.clock()
        external_id = opts.get("external_id")
        event_id: uuid.UUID = (
            derived_id(opts.get("source"), external_id) if external_id else uuid7()
        )
        return {
            "event_id": event_id,
            "agent": agent,
            "channel": channel,
            "occurred_at": occurred_at,
            **opts,
        }

    def post_message(
        self,
        agent: str,
        channel: str,
        role: str,
        content: str | Sequence[Any],
        *,
        thread: str | None = None,
        sender: str | None = None,
        source: str | None = None,
        external_id: str | None = None,
        occurred_at: dt.datetime | None = None,
    ) -> R:
        """A message: `role` is "user", "assistant" or "system" (a mid-conversation system
        message, text only); `content` is a string or Anthropic content blocks, kept as
        posted (an assistant turn exactly as the API returned it, thinking included)."""
        fields = self._common(
            agent,
            channel,
            {
                "thread": thread,
                "sender": sender,
                "source": source,
                "external_id": external_id,
                "occurred_at": occurred_at,
            },
        )
        message = ev.MessagePosted(role=role, content=_content(content), **fields)  # type: ignore[arg-type]
        return self._send(message)

    def clear(self, agent: str, channel: str, **opts: Any) -> R:
        """`/context clear`."""
        return self._send(ev.ContextCleared(**self._common(agent, channel, opts)))

    def save(self, agent: str, channel: str, description: str | None = None, **opts: Any) -> R:
        """`/context save [description]`."""
        return self._send(
            ev.SessionSaveRequested(description=description, **self._common(agent, channel, opts))
        )

    def restore(self, agent: str, channel: str, session_id: str, **opts: Any) -> R:
        """`/context restore <id|last>`."""
        return self._send(
            ev.SessionRestoreRequested(session_id=session_id, **self._common(agent, channel, opts))
        )

    def delete_session(self, agent: str, channel: str, session_id: str, **opts: Any) -> R:
        """Delete (hide) one saved session."""
        return self._send(
            ev.SessionDeleteRequested(session_id=session_id, **self._common(agent, channel, opts))
        )

    def purge_sessions(self, agent: str, channel: str, keep: int, **opts: Any) -> R:
        """Delete all but the newest `keep` sessions."""
        return self._send(
            ev.SessionsPurgeRequested(keep=keep, **self._common(agent, channel, opts))
        )

    def configure(
        self,
        agent: str,
        channel: str,
        *,
        rolling_window: Duration | None = None,
        idle_timeout: Duration | None = None,
        token_budget: int | None = None,
        **opts: Any,
    ) -> R:
        """Change per-conversation settings (durations in seconds or as timedelta)."""
        return self._send(
            ev.Configured(
                rolling_window=_seconds("rolling_window", rolling_window),
                idle_timeout=_seconds("idle_timeout", idle_timeout),
                token_budget=token_budget,
                **self._common(agent, channel, opts),
            )
        )

    def search(self, agent: str, channel: str, query: str, *, page: int = 1, **opts: Any) -> R:
        """`/context search <query>`: ingest answers with a `search_results` notice holding
        one page of this conversation's matches (syntax: `schema.search`; a query with
        nothing to look for is refused here)."""
        return self._send(
            ev.SearchRequested(query=query, page=page, **self._common(agent, channel, opts))
        )

    def set_retention(
        self,
        agent: str,
        channel: str,
        *,
        keep_log_days: int | None = None,
        keep_sessions_days: int | None = None,
        **opts: Any,
    ) -> R:
        """This conversation's retention, over its agent's policy: keep its log this many
        days after its last activity, its saved sessions this many days after they were
        saved (None: unchanged; 0: back to the agent's policy)."""
        return self._send(
            ev.RetentionSet(
                keep_log_days=keep_log_days,
                keep_sessions_days=keep_sessions_days,
                **self._common(agent, channel, opts),
            )
        )

    def set_frame(
        self,
        agent: str,
        channel: str,
        *,
        model: str,
        system: str | Sequence[Any] | None = None,
        tools: Sequence[Any] | None = None,
        thinking: Mapping[str, Any] | None = None,
        **opts: Any,
    ) -> R:
        """Register the bot's own request frame for this conversation: the model, and the
        top-level `system`, `tools` and `thinking` it sends with every request, exactly as
        sent. The worker compacts with them; sending a changed system or tool list is a
        boundary (the thinking of earlier turns no longer matches its prefix and is
        removed from the kept turns)."""
        return self._send(
            ev.FrameSet(
                model=model,
                system=None if system is None else _content(system),
                tools=None if tools is None else list(tools),
                thinking=ev.NULL
                if thinking is None
                else msgspec.Raw(msgspec.json.encode(thinking)),
                **self._common(agent, channel, opts),
            )
        )


class Batch(Commands[str]):
    """Collects events for one pipeline; each call returns the event id at once."""

    def __init__(self, encoder: Encoder, clock: Callable[[], dt.datetime]) -> None:
        self.encoder = encoder
        self.clock = clock
        self.prepared: list[Prepared] = []

    def _send(self, event: ev.Event) -> str:
        prepared = self.encoder.prepare(event)
        self.prepared.append(prepared)
        return prepared.event_id

    @property
    def ids(self) -> list[str]:
        """Event ids in the order they were added."""
        return [p.event_id for p in self.prepared]
