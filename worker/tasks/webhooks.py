"""Webhook deliveries: a dispatcher fans notices out to registered webhooks, RQ jobs POST them.

The dispatcher (a thread of `contextlog worker`) reads each followed notification stream
as its own consumer group, `webhooks`, beside the adapters' groups: ingest never waits
for it, and a notice an adapter acknowledged still reaches the webhooks. For each notice
and each webhook that wants it, one `webhook_deliveries` row (unique per pair: a notice
read twice adds none) and one job on the `webhooks` queue, queued after the rows commit;
the notices are acknowledged after that, so a crash delivers again, never less.

A job POSTs the signed payload (`effects.webhooks`) and records the attempt; on failure
RQ retries it with backoff (`BACKOFF_S`), and after the last attempt the row is `failed`
and the job is in RQ's failed registry (rq-dashboard shows both). `contextlog webhooks
deliveries` lists them; `contextlog webhooks replay ID` sends one again, under the same
`webhook-id`.
"""

from __future__ import annotations

import datetime as dt
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Final

import psycopg
import redis
import structlog
from psycopg.rows import class_row
from rq import Queue, Retry

from contextlog.producers.notifications import Notifications
from contextlog.schema.notices import Notice
from contextlog.schema.queries import query
from contextlog.worker.effects import webhooks as wh
from contextlog.worker.tasks import resources

log = structlog.get_logger("contextlog.webhooks")

QUEUE: Final = "webhooks"
GROUP: Final = "webhooks"
# Seconds before each retry (Standard Webhooks suggests exponential backoff): the first
# few catch a restart, the last ones an outage of hours.
BACKOFF_S: Final = (5, 30, 120, 600, 1800, 3600, 7200, 14400, 28800, 43200)
STALLED_S: Final = 600  # a pending delivery this far past due lost its job
RESULT_TTL: Final = 86400
ERROR_CHARS: Final = 300
Connect = Callable[[], AbstractContextManager[psycopg.Connection[Any]]]


@dataclass(frozen=True)
class Webhook:
    """A registered webhook (`webhooks` row)."""

    webhook_id: str
    url: str
    source: str
    kinds: list[str]
    agents: list[str]
    channels: list[str] | None
    secret: str
    created_by: str | None
    created_at: dt.datetime

    def wants(self, notice: Notice) -> bool:
        """Whether this webhook gets `notice` (of its kinds, agents and channels, and
        not from before it was registered)."""
        return (
            notice.kind in self.kinds
            and ("*" in self.agents or notice.agent in self.agents)
            and (self.channels is None or notice.channel in self.channels)
            and notice.occurred_at >= self.created_at
        )


@dataclass(frozen=True)
class Delivery:
    """One notice to one webhook, as listed (`webhook_deliveries` row)."""

    delivery_id: str
    webhook_id: str
    notice_id: str
    kind: str
    status: str
    attempts: int
    last_status: int | None
    last_error: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    delivered_at: dt.datetime | None


def register(
    conn: psycopg.Connection[Any],
    *,
    url: str,
    source: str,
    kinds: Sequence[str],
    agents: Sequence[str],
    channels: Sequence[str] | None,
    created_by: str | None,
) -> Webhook:
    """Store a new webhook with a fresh secret (the caller checked its target)."""
    params = {
        "webhook_id": "wh_" + uuid.uuid4().hex[:20],
        "url": url,
        "source": source,
        "kinds": sorted(set(kinds)),
        "agents": list(agents),
        "channels": list(channels) if channels else None,
        "secret": wh.new_secret(),
        "created_by": created_by,
    }
    with conn.transaction(), conn.cursor(row_factory=class_row(Webhook)) as cur:
        row = cur.execute(query("insert_webhook"), params).fetchone()
    assert row is not None
    return row


def listed(conn: psycopg.Connection[Any]) -> list[Webhook]:
    """Every live webhook, oldest first."""
    with conn.cursor(row_factory=class_row(Webhook)) as cur:
        rows = cur.execute(query("list_webhooks")).fetchall()
    conn.rollback()
    return rows


def delete(conn: psycopg.Connection[Any], webhook_id: str) -> bool:
    """Stop a webhook's deliveries (its rows stay, for the record)."""
    with conn.transaction():
        return (
            conn.execute(query("delete_webhook"), {"webhook_id": webhook_id}).fetchone() is not None
        )


def deliveries(
    conn: psycopg.Connection[Any],
    webhook_id: str | None = None,
    status: str | None = None,
    limit: int = 50,
) -> list[Delivery]:
    """Deliveries, newest first."""
    params = {"webhook_id": webhook_id, "status": status, "limit": limit}
    with conn.cursor(row_factory=class_row(Delivery)) as cur:
        rows = cur.execute(query("list_deliveries"), params).fetchall()
    conn.rollback()
    return rows


class Deliveries:
    """Queues delivery jobs on the `webhooks` queue."""

    def __init__(self, client: redis.Redis, attempts: int) -> None:
        self.queue = Queue(QUEUE, connection=client)
        self.attempts = attempts

    def enqueue(self, delivery_ids: Sequence[str]) -> None:
        """One job per delivery, retried with backoff up to the configured attempts."""
        retries = self.attempts - 1
        for delivery_id in delivery_ids:
            self.queue.enqueue_call(
                "contextlog.worker.tasks.webhooks.deliver_webhook",
                args=(delivery_id,),
                job_id=f"webhook-{delivery_id}-{uuid.uuid4().hex[:8]}",
                description=f"webhook delivery {delivery_id}",
                result_ttl=RESULT_TTL,
                retry=Retry(max=retries, interval=list(BACKOFF_S[:retries])) if retries else None,
            )

    def replay(
        self, conn: psycopg.Connection[Any], delivery_id: str, webhook_id: str | None = None
    ) -> bool:
        """Send a delivery again (its attempts start over); False if there is none (of
        `webhook_id`, when given)."""
        params = {"delivery_id": delivery_id, "webhook_id": webhook_id}
        with conn.transaction():
            row = conn.execute(query("replay_delivery"), params).fetchone()
        if row is not None:
            self.enqueue([delivery_id])
        return row is not None


class Dispatcher:
    """Fans notices out to webhooks: one `cycle` reads every followed stream once."""

    def __init__(
        self, connect: Connect, client: Any, deliveries: Deliveries, consumer: str
    ) -> None:
        self.connect = connect
        self.client = client  # REDIS_URL: the notification streams
        self.deliveries = deliveries
        self.consumer = consumer
        self._readers: dict[str, Notifications] = {}

    def cycle(self, count: int = 100) -> int:
        """Read each followed stream once; returns how many deliveries were queued."""
        with self.connect() as conn:
            hooks = listed(conn)
            by_source: dict[str, list[Webhook]] = {}
            for hook in hooks:
                by_source.setdefault(hook.source, []).append(hook)
            queued = sum(self._source(conn, s, h, count) for s, h in by_source.items())
            self._requeue_stalled(conn)
        return queued

    def _source(
        self, conn: psycopg.Connection[Any], source: str, hooks: list[Webhook], count: int
    ) -> int:
        reader = self._readers.get(source)
        if reader is None:
            reader = Notifications(self.client, source, group=GROUP, consumer=self.consumer)
            self._readers[source] = reader
        notices = reader.read(count=count, block_ms=None)
        if not notices:
            return 0
        rows = []
        with conn.transaction():
            for notice in notices:
                for hook in hooks:
                    if hook.wants(notice):
                        rows += _insert(conn, hook, notice)
        self.deliveries.enqueue(rows)
        reader.ack(notices)
        return len(rows)

    def _requeue_stalled(self, conn: psycopg.Connection[Any]) -> None:
        rows = conn.execute(
            query("stalled_deliveries"), {"grace": STALLED_S, "limit": 500}
        ).fetchall()
        conn.rollback()
        if rows:
            log.info("stalled webhook deliveries queued again", count=len(rows))
            self.deliveries.enqueue([r[0] for r in rows])


def _insert(conn: psycopg.Connection[Any], hook: Webhook, notice: Notice) -> list[str]:
    params = {
        "delivery_id": wh.delivery_id(hook.webhook_id, notice.notice_id),
        "webhook_id": hook.webhook_id,
        "notice_id": notice.notice_id,
        "kind": notice.kind,
        "payload": wh.payload(notice),
        "agent": notice.agent,
        "channel": notice.channel,
    }
    return [r[0] for r in conn.execute(query("insert_delivery"), params).fetchall()]


# -- one attempt ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Due(Delivery):
    """A delivery with what sending it needs."""

    payload: bytes
    url: str
    secret: str
    deleted: bool


Post = Callable[[str, dict[str, str], bytes, float], int]


class DeliveryFailed(Exception):
    """Raised by a job whose attempt failed, so that RQ retries it (or records it failed)."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect is an answer, not a new target: only registered URLs


_opener = urllib.request.build_opener(_NoRedirect)


def post(url: str, headers: dict[str, str], body: bytes, timeout: float) -> int:
    """POST `body`; the response's status (an HTTP error status too)."""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with _opener.open(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


@dataclass(frozen=True)
class Policy:
    """What an attempt may do: targets (see `effects.webhooks`), timeout, attempts."""

    hosts: tuple[str, ...]
    allow_private: bool
    timeout: float
    attempts: int
    resolve: wh.Resolve = wh.resolve


def attempt(
    conn: psycopg.Connection[Any],
    delivery_id: str,
    policy: Policy,
    now: dt.datetime,
    send: Post = post,
) -> str:
    """Send one delivery once; records the attempt. Returns its status (`delivered`,
    `pending`: to retry, `failed`: the last attempt, `skipped`: nothing to do)."""
    with conn.cursor(row_factory=class_row(_Due)) as cur:
        row = cur.execute(query("get_delivery"), {"delivery_id": delivery_id}).fetchone()
    conn.rollback()
    if row is None or row.status != "pending" or row.deleted:
        return "skipped"  # delivered, failed for good, or its webhook was deleted
    code, error = _send(row.url, row.secret, delivery_id, bytes(row.payload), policy, now, send)
    ok = code is not None and 200 <= code < 300
    last = row.attempts + 1 >= policy.attempts
    status = "delivered" if ok else ("failed" if last else "pending")
    retry_in = BACKOFF_S[min(row.attempts, len(BACKOFF_S) - 1)]
    params = {
        "delivery_id": delivery_id,
        "status": status,
        "last_status": code,
        "last_error": error,
        "next_at": None if ok or last else now + dt.timedelta(seconds=retry_in),
    }
    with conn.transaction():
        conn.execute(query("record_attempt"), params)
    return status


def _send(
    url: str,
    secret: str,
    delivery_id: str,
    body: bytes,
    policy: Policy,
    now: dt.datetime,
    send: Post,
) -> tuple[int | None, str | None]:
    stamp = int(now.timestamp())
    headers = {
        "content-type": "application/json",
        "user-agent": "contextlog-webhooks",
        "webhook-id": delivery_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": wh.sign(secret, delivery_id, stamp, body),
    }
    try:
        wh.check_target(url, policy.hosts, policy.allow_private, policy.resolve)
        code = send(url, headers, body, policy.timeout)
    except (wh.TargetRefused, OSError) as e:
        return None, str(e)[:ERROR_CHARS]
    return code, None if 200 <= code < 300 else f"HTTP {code}"


def policy_of(settings: Any) -> Policy:
    """The delivery policy of the worker's settings."""
    return Policy(
        hosts=settings.webhook_hosts,
        allow_private=settings.webhook_allow_private,
        timeout=settings.webhook_timeout,
        attempts=settings.webhook_attempts,
    )


# -- RQ entry point ---------------------------------------------------------------------


def deliver_webhook(delivery_id: str) -> str:
    """RQ job on `webhooks`: one attempt of one delivery; raises to be retried."""
    res = resources.current()
    with res.reader.connection() as conn:
        status = attempt(conn, delivery_id, policy_of(res.settings), res.clock.now())
    if status in ("pending", "failed"):
        raise DeliveryFailed(f"webhook delivery {delivery_id} failed ({status})")
    return status
