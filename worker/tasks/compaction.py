"""Compaction of a thread's segment, in the background (docs/context.md, "Compaction").

When a segment passes `COMPACT_AT` of its budget, a job reads the thread's context as the
bot does and picks where to cut (`compaction_split`: before the newest user turn that
opens an exchange after a finished answer). Then:

- on a model with the API's on-demand compaction (beta `compact-2026-09-04`), with the
  conversation's registered frame (model, system, tools) and an API key, it sends the
  messages before the cut exactly as the bot sent them, with our header after the bot's
  system, and keeps the `compaction` block the API returns: the segment then starts with
  it, and every message after the cut follows it unchanged, thinking included (the API's
  "compaction in the background");
- otherwise, or when the API gives no block (a refusal, a cut-off or empty summary, a
  400, retries exhausted), our summarizer writes a summary that lands at the thread's
  next opening message, as a boundary that removes the kept turns' thinking.

Either way the result is an event pushed to the conversation's stream, so ingest stays
the only writer of the log, and a compaction that a boundary overtook is ignored there.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Final

import anthropic
import msgspec
import structlog

from contextlog.producers.context import Context, StoredMessage, compaction_split
from contextlog.producers.ids import derived_id
from contextlog.producers.reader import ContextReader
from contextlog.schema import events as ev
from contextlog.worker.tasks.deadline import Deadlines
from contextlog.worker.tasks.queue import JOB_SOURCE
from contextlog.worker.tasks.summarize import Retry, Summarizer, call_api, storable

log = structlog.get_logger("contextlog.compaction")

BETA: Final = "compact-2026-09-04"
MAX_TOKENS: Final = 4096
# Models with on-demand compaction (the platform docs' list; a newer release of a family
# shares its prefix): every other model gets our summary.
MODELS: Final = (
    "claude-fable-5",
    "claude-mythos-5",
    "claude-mythos-preview",
    "claude-opus-4-6",
    "claude-opus-4-7",
    "claude-opus-4-8",
    "claude-opus-5",
    "claude-sonnet-4-6",
    "claude-sonnet-5",
)


def supports(model: str | None) -> bool:
    """Whether `model` takes the API's on-demand compaction."""
    return model is not None and model.startswith(MODELS)


@dataclass(frozen=True)
class Plan:
    """What a compaction of one thread's segment covers."""

    agent: str
    channel: str
    thread: str
    context: Context  # the thread's context as the bot reads it
    messages: list[StoredMessage]  # what it was built from
    boundaries: int  # the segment's identity: a boundary since makes the result moot
    base_seq: int
    keep_from: int  # context.messages[:keep_from] are summarised
    through: int  # the log position of the last message summarised

    def summarised(self) -> list[tuple[str, Any]]:
        """The summarised messages as stored, for our summarizer."""
        return [(m.role, m.content) for m in self.messages if m.seq <= self.through]


def plan(reader: ContextReader, agent: str, channel: str, thread: str) -> Plan | None:
    """The compaction of a thread's segment as it stands; None when there is nothing to
    summarise before its newest exchange."""
    read = reader.segment(agent, channel, thread or None)
    split = compaction_split(read.context)
    if split is None or read.segment is None:
        return None
    keep_from, through = split
    return Plan(
        agent,
        channel,
        thread,
        read.context,
        read.messages,
        read.segment.boundaries,
        read.segment.start,
        keep_from,
        through,
    )


class ApiCompactor:
    """On-demand compaction over the Messages API, retried as summaries are."""

    def __init__(
        self,
        client: anthropic.Anthropic,
        retry: Retry,
        deadlines: Deadlines | None = None,
        budget: float = 60.0,
    ) -> None:
        self.client = client
        self.retry = retry
        self.deadlines = deadlines
        self.budget = budget

    def compact(self, p: Plan) -> dict[str, Any] | None:
        """The API's compaction block for the plan's summarised messages (as the API
        returned it, byte for byte), or None when it gave none."""
        frame = p.context.frame
        if frame is None:
            return None
        request = p.context.to_anthropic(system=frame.system, tools=frame.tools)
        request["messages"] = request["messages"][: p.keep_from]
        thinking = frame.thinking or _thinking_for(request["messages"])
        if thinking is not None:
            request["thinking"] = thinking

        def send() -> Any:
            raw = self.client.beta.messages.with_raw_response.create(
                model=frame.model,
                max_tokens=MAX_TOKENS,
                betas=[BETA],
                compaction={"type": "summarize"},
                **request,
            )
            return raw.http_response.json()

        outcome, tries = self.retry.run(
            lambda: call_api(send, self.deadlines, self.budget), "compaction"
        )
        if outcome.value is None:
            log.warning("compaction.api_failed", attempts=tries, **outcome.fields("compaction"))
            return None
        return _block(outcome.value)


def _thinking_for(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The bot had thinking on if its turns hold thinking (a frame that did not say):
    the API refuses thinking in a final assistant turn of a request without it."""
    held = any(
        b.get("type") in ("thinking", "redacted_thinking")
        for m in messages
        if m["role"] == "assistant"
        for b in m["content"]
    )
    return {"type": "adaptive"} if held else None


def _block(body: Any) -> dict[str, Any] | None:
    """The compaction block of a response, if it holds a summary."""
    if not isinstance(body, dict) or body.get("stop_reason") != "compaction":
        reason = body.get("stop_reason") if isinstance(body, dict) else None
        log.info("compaction.no_block", stop_reason=reason)
        return None
    content = body.get("content")
    blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
    for block in blocks:
        if block.get("type") == "compaction" and (
            block.get("content") is not None or block.get("encrypted_content") is not None
        ):
            # Sent back as returned, less null fields (the API refuses extra ones).
            return {k: v for k, v in block.items() if v is not None}
    log.info("compaction.no_summary")  # content null: the API's no-op
    return None


def api_event(p: Plan, block: dict[str, Any], at: dt.datetime) -> ev.ContextCompacted:
    """The event of an API compaction."""
    return ev.ContextCompacted(
        **_common(p, at),
        block=msgspec.Raw(msgspec.json.encode(block)),
    )


def summary_event(
    p: Plan, summarizer: Summarizer, previous: str | None, at: dt.datetime
) -> ev.ContextCompacted | None:
    """The event of our own compaction; None when the summary failed."""
    summary = summarizer.summarize(p.summarised(), previous=previous, purpose="compaction")
    if summary.failed:
        return None
    return ev.ContextCompacted(
        **_common(p, at), summary=storable(summary.text)[0], local=summary.local
    )


def _common(p: Plan, at: dt.datetime) -> dict[str, Any]:
    key = f"compact\x00{p.agent}\x00{p.channel}\x00{p.thread}\x00{p.boundaries}\x00{p.through}"
    return {
        "event_id": derived_id(JOB_SOURCE, key),
        "agent": p.agent,
        "channel": p.channel,
        "thread": p.thread or None,
        "occurred_at": at,
        "through_seq": p.through,
        "base_seq": p.base_seq,
        "seen_seq": p.context.last_seq or 0,
        "remaining_tokens": 0,
        "boundaries": p.boundaries,
    }
