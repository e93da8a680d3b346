"""Handlers of the process and the deployment: health, status, webhooks.

Webhook administration is rare and uses the blocking store of the worker's dispatcher
(`tasks.webhooks`), in a worker thread.
"""

from __future__ import annotations

import msgspec
import redis
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from contextlog.schema import notices as nt
from contextlog.worker.api import models as m
from contextlog.worker.api.app import JSON, Call
from contextlog.worker.api.keys import ApiKey
from contextlog.worker.api.problems import ApiError
from contextlog.worker.app.status import Status, gather
from contextlog.worker.effects import webhooks as wh
from contextlog.worker.tasks import webhooks as hooks


async def health(call: Call) -> Response:
    """Whether this process reaches Redis and Postgres (no key needed): 200, or 503."""
    s = call.services
    try:
        redis_ok = bool(await s.redis.ping())
    except (redis.RedisError, OSError):
        redis_ok = False
    try:
        async with s.pool.connection(timeout=2) as conn:
            await conn.execute("SELECT 1")
        pg_ok = True
    except Exception:  # any failure means "not healthy", and that is the answer
        pg_ok = False
    body = m.Health(ok=redis_ok and pg_ok, redis=redis_ok, postgres=pg_ok)
    return Response(msgspec.json.encode(body), 200 if body.ok else 503, media_type=JSON)


async def status(call: Call) -> Status:
    """`contextlog status --json`: per-shard lag, pending work, dead letters, jobs."""
    s = call.services

    def gathered() -> Status:
        with s.sync_reader.connection() as conn:
            queue = s.deliveries.queue.connection
            return gather(s.sync_producer.redis, conn, s.settings.shards, s.clock.now(), queue)

    return await run_in_threadpool(gathered)


def _visible(key: ApiKey, hook: hooks.Webhook) -> bool:
    return all(key.allows_agent(a) for a in hook.agents) and (
        key.channels is None
        or (hook.channels is not None and set(hook.channels) <= set(key.channels))
    )


def _out(hook: hooks.Webhook, secret: bool = False) -> m.WebhookOut:
    out = msgspec.convert(hook, m.WebhookOut, from_attributes=True)
    return out if secret else msgspec.structs.replace(out, secret=msgspec.UNSET)


def _scope(key: ApiKey, body: m.WebhookIn) -> tuple[list[str], list[str] | None]:
    agents = body.agents or key.agents
    channels = body.channels or key.channels
    for agent in agents:
        if agent == "*" and "*" not in key.agents:
            raise ApiError(403, "forbidden", "this key is not scoped to every agent ('*')")
        if not key.allows_agent(agent):
            raise ApiError(403, "forbidden", f"this key is not scoped to {agent}")
    if key.channels is not None and not set(channels or []) <= set(key.channels):
        raise ApiError(403, "forbidden", "this key is not scoped to those channels")
    return list(agents), list(channels) if channels else None


async def create_webhook(call: Call) -> m.WebhookOut:
    """Register a webhook; the answer shows its signing secret, once."""
    body: m.WebhookIn = call.body
    unknown = sorted(set(body.kinds) - nt.KINDS)
    if unknown:
        raise ApiError(
            422,
            "invalid-request",
            f"unknown notice kinds {unknown}; known: {sorted(nt.KINDS)}",
            reason="invalid",
        )
    agents, channels = _scope(call.api_key, body)
    settings = call.services.settings

    def register() -> hooks.Webhook:
        try:
            wh.check_target(body.url, settings.webhook_hosts, settings.webhook_allow_private)
        except wh.TargetRefused as e:
            raise ApiError(422, "target-refused", str(e), reason="invalid") from None
        with call.services.sync_reader.connection() as conn:
            return hooks.register(
                conn,
                url=body.url,
                source=body.source,
                kinds=body.kinds,
                agents=agents,
                channels=channels,
                created_by=call.api_key.key_id,
            )

    return _out(await run_in_threadpool(register), secret=True)


async def _hooks(call: Call) -> list[hooks.Webhook]:
    def load() -> list[hooks.Webhook]:
        with call.services.sync_reader.connection() as conn:
            return hooks.listed(conn)

    return [h for h in await run_in_threadpool(load) if _visible(call.api_key, h)]


async def _hook(call: Call) -> hooks.Webhook:
    wanted = call.path["webhook_id"]
    for hook in await _hooks(call):
        if hook.webhook_id == wanted:
            return hook
    raise ApiError(404, "not-found", f"there is no webhook {wanted!r} this key may see")


async def list_webhooks(call: Call) -> m.WebhookList:
    """The webhooks of this key's agents."""
    return m.WebhookList(webhooks=[_out(h) for h in await _hooks(call)])


async def delete_webhook(call: Call) -> None:
    """Stop a webhook's deliveries."""
    hook = await _hook(call)

    def delete() -> None:
        with call.services.sync_reader.connection() as conn:
            hooks.delete(conn, hook.webhook_id)

    await run_in_threadpool(delete)


async def list_deliveries(call: Call) -> m.DeliveryList:
    """A webhook's deliveries, newest first (`webhook-id`, status, attempts)."""
    hook = await _hook(call)
    q: m.DeliveryQuery = call.query

    def load() -> list[hooks.Delivery]:
        with call.services.sync_reader.connection() as conn:
            return hooks.deliveries(conn, hook.webhook_id, q.status, q.limit)

    rows = await run_in_threadpool(load)
    return m.DeliveryList(deliveries=rows)


async def replay_delivery(call: Call) -> m.Replayed:
    """Send a delivery again, under the same `webhook-id` (its attempts start over)."""
    hook = await _hook(call)
    delivery_id = call.path["delivery_id"]

    def replay() -> bool:
        with call.services.sync_reader.connection() as conn:
            return call.services.deliveries.replay(conn, delivery_id, hook.webhook_id)

    if not await run_in_threadpool(replay):
        raise ApiError(
            404, "not-found", f"webhook {hook.webhook_id} has no delivery {delivery_id!r}"
        )
    return m.Replayed(delivery_id=delivery_id)
