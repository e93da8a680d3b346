"""Handlers of one conversation: post messages and commands, read its context and settings."""

from __future__ import annotations

from typing import Any

from contextlog.producers.context import Context
from contextlog.schema.queries import query
from contextlog.worker.api import commands
from contextlog.worker.api import models as m
from contextlog.worker.api.app import Call
from contextlog.worker.api.problems import ApiError

IDEMPOTENCY_HEADER = "idempotency-key"
MAX_IDEMPOTENCY_KEY = 150


def idempotency_key(call: Call) -> str | None:
    """The Idempotency-Key header, checked."""
    key = call.request.headers.get(IDEMPOTENCY_HEADER)
    if key is not None and not (0 < len(key) <= MAX_IDEMPOTENCY_KEY and key.isprintable()):
        raise ApiError(
            422,
            "invalid-request",
            f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY} printable characters",
            reason="invalid",
        )
    return key


async def send_one(call: Call, kind: str, body: Any) -> m.Accepted:
    """Build, check and send one event of this conversation."""
    now = call.services.clock.now()
    event = commands.build(kind, call.agent, call.channel, body, now, idempotency_key(call))
    prepared = commands.prepare_all(call.services.producer.encoder, [event])
    (event_id,) = await call.services.producer.send_prepared(prepared)
    return m.Accepted(event_id=event_id)


async def post_message(call: Call) -> m.Accepted:
    """Post a message. With `external_id` (or Idempotency-Key) a re-sent request returns
    the same event id and is stored once."""
    return await send_one(call, "message", call.body)


async def post_batch(call: Call) -> m.BatchAccepted:
    """Post messages and commands of any conversations the key may post to, in order."""
    items: list[m.Item] = call.body.items
    for i, item in enumerate(items):
        if not call.api_key.allows(item.agent, item.channel):
            raise ApiError(
                403, "forbidden", f"item {i}: this key is not scoped to {item.agent}/{item.channel}"
            )
        call.api_key.check(commands.RIGHTS[commands.kind_of(item)])
    events = commands.batch(items, call.services.clock.now(), idempotency_key(call))
    prepared = commands.prepare_all(call.services.producer.encoder, events)
    return m.BatchAccepted(event_ids=await call.services.producer.send_prepared(prepared))


async def clear(call: Call) -> m.Accepted:
    """`/context clear`: the window starts afresh (the log keeps everything)."""
    return await send_one(call, "clear", call.body)


async def configure(call: Call) -> m.Accepted:
    """Change the conversation's settings (as the configure command)."""
    return await send_one(call, "configure", call.body)


async def settings(call: Call) -> m.SettingsOut:
    """The conversation's settings in force."""
    defaults = call.services.settings.conversation
    async with call.services.pool.connection() as conn:
        cur = await conn.execute(
            query("conversation_settings"), {"agent": call.agent, "channel": call.channel}
        )
        row = await cur.fetchone()
    window, idle, budget = row if row is not None else (None, None, None)
    return m.SettingsOut(
        rolling_window=defaults.rolling_window if window is None else window,
        idle_timeout=defaults.idle_timeout if idle is None else idle,
        token_budget=defaults.token_budget if budget is None else budget,
    )


async def set_retention(call: Call) -> m.Accepted:
    """This conversation's retention over its agent's policy (`Producer.set_retention`)."""
    return await send_one(call, "retention", call.body)


async def set_frame(call: Call) -> m.Accepted:
    """Register the bot's own request frame (`Producer.set_frame`)."""
    return await send_one(call, "frame", call.body)


async def _read(
    call: Call, thread: str | None, wait_for: Any, timeout: float, system_messages: Any
) -> Context:
    return await call.services.reader.context(
        call.agent,
        call.channel,
        thread,
        wait_for=None if wait_for is None else str(wait_for),
        timeout=timeout,
        system_messages=system_messages,
    )


async def context(call: Call) -> m.ContextOut:
    """The context of one thread, valid for the Messages API; with `wait_for`, once that
    event is stored (503 `not-visible` if it is not within `timeout` seconds)."""
    q: m.ContextQuery = call.query
    return m.ContextOut.from_context(
        await _read(call, q.thread, q.wait_for, q.timeout, q.system_messages)
    )


async def turn(call: Call) -> m.TurnOut:
    """Post a message and read its thread's `messages.create` request once it is stored:
    a bot's turn in one round trip (the key needs `read` besides `post`)."""
    b: m.TurnIn = call.body
    call.api_key.check("read", call.agent, call.channel)
    posted = await send_one(call, "message", b)
    ctx = await _read(call, b.thread, posted.event_id, b.timeout, b.system_messages)
    kwargs = ctx.to_anthropic(system=b.system, tools=b.tools, cache=b.cache)
    return m.TurnOut(
        event_id=posted.event_id,
        request=m.AnthropicRequest(**kwargs),
        token_estimate=ctx.token_estimate,
        truncated=ctx.truncated,
        compacted=ctx.compacted,
        boundary=m.BoundaryOut.of(ctx.boundary),
        thinking_removed=ctx.thinking_removed,
        over_budget=ctx.over_budget,
    )


async def request(call: Call) -> m.RequestOut:
    """`Context.to_anthropic(system=, tools=, cache=)`: the keyword arguments of
    `messages.create` (besides model and max_tokens), the bot's system and tools first."""
    b: m.RequestIn = call.body
    ctx = await _read(call, b.thread, b.wait_for, b.timeout, b.system_messages)
    kwargs = ctx.to_anthropic(system=b.system, tools=b.tools, cache=b.cache)
    return m.RequestOut(
        request=m.AnthropicRequest(**kwargs),
        token_estimate=ctx.token_estimate,
        truncated=ctx.truncated,
        compacted=ctx.compacted,
        boundary=m.BoundaryOut.of(ctx.boundary),
        thinking_removed=ctx.thinking_removed,
        over_budget=ctx.over_budget,
    )
