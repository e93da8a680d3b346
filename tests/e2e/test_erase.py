"""The proof of erase (issue 34.4), with the processes of the Procfile on private servers.

The canary test plants one user's canary everywhere contextlog keeps things (message
text, a tool's input, a 1 MB attachment, a summary the Messages API wrote, a dead letter,
an entry still waiting in an inbound stream, a search's notification, a compaction-free
session) beside a second user's canary in the same conversations; erases the first user;
then reads every table, a `pg_dump` of the data and every Redis key for it: none is left,
the second user's are all there, and their contexts are still accepted by the API.

The load test erases a sender while ingest stores a steady load in the same shards: every
event of the load is stored once, in order, and each of the sender's events is erased
exactly when it came before its shard's erase.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from contextlog.producers import ContextReader, Producer
from contextlog.producers.ids import uuid7
from contextlog.schema import codec, erasure, keys
from contextlog.schema import notices as nt
from contextlog.worker.app import bootstrap
from contextlog.worker.app.config import Settings
from tests.support import canary
from tests.support.anthropic_rules import check_messages
from tests.support.fake_anthropic import FakeAPI, FakeAPIServer, Outcome, answer, client_for
from tests.support.stack import SHARDS, Load, Stack, content, stored, until, wait_growing

pytestmark = pytest.mark.e2e

AGENT = "bot"
ANN = "zq-canary-ann-5501"
BOB = "zq-canary-bob-6602"
MB = 1 << 20


class EchoAPIServer(FakeAPIServer):
    """A Messages API whose summaries repeat what they were given: a summary holds a
    user's canary exactly when the messages it summarised did."""

    def _answer(self, path: str, body: object, betas: str = "") -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict) or path.split("?")[0] != "/v1/messages":
            return super()._answer(path, body, betas)
        said = " ".join(_texts(body.get("messages")))[:4000]
        self._count()
        return answer(body, Outcome.ok(f"Summary: {said}"), betas)


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for k, v in value.items() if k not in ("type", "source") for t in _texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []


def attachment(seed: str, size: int = MB) -> dict[str, Any]:
    """A document of `size` bytes holding `seed` over and over (canonical base64)."""
    data = (seed.encode() + b"\x00" * 13) * (size // (len(seed) + 13) + 1)
    raw = base64.b64encode(data[:size]).decode()
    return {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": raw},
    }


def exchange(p: Producer, channel: str, who: str, secret: str, n: int, **extra: Any) -> None:
    """A question with the secret, a tool call with it as input, its result, the answer."""
    tool = f"toolu_{channel}_{n}"
    ask: Any = f"{who} here: my account is {secret}"
    if extra.get("with_attachment"):
        ask = [{"type": "text", "text": ask}, attachment(secret)]
    p.post_message(AGENT, channel, "user", ask, sender=who, source="e2e")
    p.post_message(
        AGENT,
        channel,
        "assistant",
        [{"type": "tool_use", "id": tool, "name": "lookup", "input": {"account": secret}}],
        source="e2e",
    )
    p.post_message(
        AGENT,
        channel,
        "user",
        [{"type": "tool_result", "tool_use_id": tool, "content": f"{secret}: active"}],
        source="e2e",
    )
    p.post_message(AGENT, channel, "assistant", f"{secret} is active", source="e2e")


def notices(stack: Stack, kind: str) -> list[nt.Notice]:
    out = []
    client: Any = stack.client  # replies are bytes
    for _, fields in client.xrange(keys.outbox("e2e")):
        n = nt.decode(fields[nt.ENTRY_FIELD.encode()])
        if n.kind == kind:
            out.append(n)
    return out


def summaries(stack: Stack) -> list[tuple[str, str | None, int]]:
    rows = stack.sql("SELECT channel, summary, summary_round FROM sessions ORDER BY channel")
    return [(str(c), s, int(r)) for c, s, r in rows]


def operator(stack: Stack) -> Producer:
    """An operator's producer: it signs an erase with the deployment's key (the one the
    stack's first process kept in Postgres), as `contextlog erase` does."""
    settings = Settings.from_env({"DATABASE_URL": stack.database_url, "REDIS_URL": stack.redis.url})
    return Producer(stack.client, shards=SHARDS, signing_key=bootstrap.signing_key(settings))


def test_an_erased_senders_canary_is_nowhere_and_the_others_is_everywhere(
    make_stack: Callable[[], Stack],
) -> None:
    stack = make_stack()
    with EchoAPIServer(latency=0.01) as api:
        ingest = stack.add_ingest()
        stack.add_worker(ANTHROPIC_API_KEY="test-key", ANTHROPIC_BASE_URL=api.url)
        p = operator(stack)
        exchange(p, "general", "ann", ANN, 1, with_attachment=True)
        exchange(p, "general", "bob", BOB, 2, with_attachment=True)
        exchange(p, "dm-ann", "ann", ANN, 3)
        for channel in ("general", "dm-ann"):
            p.save(AGENT, channel, source="e2e")
        until(
            lambda: len(summaries(stack)) == 2 and all(s for _, s, _ in summaries(stack)),
            60,
            lambda: f"summaries {summaries(stack)}\n{stack.tails()}",
        )
        assert all(ANN in str(s) for _, s, _ in summaries(stack))  # the API repeated it
        p.search(AGENT, "general", ANN, sender="ann", source="e2e")
        bad = {
            "type": "message.v1",
            "event_id": str(uuid7()),
            "agent": AGENT,
            "channel": "general",
            "sender": "ann",
            "occurred_at": "2026-01-01T00:00:00Z",
            "role": "narrator",
            "content": f"dead {ANN}",
        }
        shard = keys.shard_of(AGENT, "general", SHARDS)
        stack.client.xadd(keys.stream(shard), {codec.ENTRY_FIELD: json.dumps(bad).encode()})
        until(lambda: notices(stack, nt.SEARCH_RESULTS) and stack.dead_letters(), 30, stack.tails)

        stack.freeze(ingest)  # what ann says now waits in the stream, then the erase
        p.post_message(AGENT, "dm-ann", "user", f"one more thing: {ANN}", sender="ann")
        ids = p.erase(AGENT, sender="ann", source="e2e")
        stack.thaw(ingest)
        until(lambda: len(notices(stack, nt.ERASE_DONE)) == len(ids), 60, stack.tails)
        until(
            lambda: all(s is not None and r == 1 for _, s, r in summaries(stack)),
            60,
            lambda: f"summaries {summaries(stack)}\n{stack.tails()}",
        )
        until(  # the workers' indexer caught up (it runs right after ingest)
            lambda: stack.sql("SELECT count(*) FROM search_pending") == [(0,)], 30, stack.tails
        )
        stack.assert_running()

    in_postgres = canary.postgres(stack.database_url, [ANN, BOB])
    in_redis = canary.redis_keys(stack.client, [ANN, BOB])
    assert ANN not in in_postgres, in_postgres[ANN]
    assert ANN not in in_redis, in_redis[ANN]
    assert {"events", "attachments", "sessions", "pg_dump"} <= in_postgres[BOB]
    # (search rows hold words, not the canary whole: the search below finds it)
    assert in_redis[BOB]  # its notices and inbound entries stay
    reader = ContextReader.from_url(stack.database_url)
    client = client_for(FakeAPI())
    try:
        for channel in ("general", "dm-ann"):
            ctx = reader.context(AGENT, channel)
            assert check_messages(ctx.messages) == []
            request = ctx.to_anthropic()
            client.messages.create(model="claude-fable-5-1", max_tokens=64, **request)
            assert ANN not in json.dumps(request)
        assert BOB in json.dumps(reader.context(AGENT, "general").messages)
        assert reader.search(AGENT, ANN).total == 0 and reader.search(AGENT, BOB).total == 4
    finally:
        reader.close()


def test_an_erase_under_load_loses_and_doubles_nothing_of_the_others(
    make_stack: Callable[[], Stack],
) -> None:
    stack = make_stack()
    stack.add_ingest()
    stack.add_ingest()
    ann = Ann(stack.redis.url)
    with Load(stack.redis.url, rate=800, conversations=20) as load, ann:
        load.wait_pushed(2000)
        erased = operator(stack).erase("load", sender="ann", source="e2e")
        load.wait_pushed(5000)
    wanted = load.total + ann.total + len(erased)  # the erase events are the agent's too
    wait_growing(lambda: stack.count("load"), wanted, 120, stack.tails)
    until(lambda: len(notices(stack, nt.ERASE_DONE)) == len(erased), 60, stack.tails)
    stack.assert_running()

    log = stored(stack.database_url, "load")
    for channel, ids in load.pushed.items():
        got = log[channel]
        assert [e for _, e, _ in got] == ids, f"{channel}: lost, doubled or reordered"
        assert [s for s, _, _ in got] == list(range(1, len(ids) + 1))
        assert [t for _, _, t in got] == [content(channel, n) for n in range(len(ids))]
    erases = dict(
        stack.sql(
            "SELECT (payload->>'shard')::int, position FROM events"
            " WHERE agent = 'load' AND kind = 'erase.v1'"
        )
    )
    assert sorted(erases) == list(range(SHARDS))  # each shard's applied once
    rows = stack.sql(
        "SELECT channel, position, payload ? 'erased', payload->>'content' FROM events"
        " WHERE agent = 'load' AND channel LIKE 'ann-%%' ORDER BY position"
    )
    assert len(rows) == ann.total > 0
    for channel, position, redacted, text in rows:
        at = erases[erasure.shard_of("load", channel, SHARDS)]
        assert redacted == (position < at), (channel, position, at)
        assert (text == erasure.ERASED_TEXT) == redacted
    assert any(r[2] for r in rows) and not all(r[2] for r in rows)  # before and after


class Ann:
    """A sender posting to the load's agent, in conversations of her own, from a thread."""

    def __init__(self, redis_url: str) -> None:
        self.producer = Producer.from_url(redis_url, shards=SHARDS)
        self.stop = threading.Event()
        self.total = 0
        self.thread = threading.Thread(target=self._run, name="ann", daemon=True)

    def __enter__(self) -> Ann:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            self.producer.post_message(
                "load",
                f"ann-{n % 8}",
                "user",
                f"ann #{n}",
                sender="ann",
                external_id=f"ann#{n}",
                source="load",
            )
            n += 1
            self.total = n
            time.sleep(0.01)
