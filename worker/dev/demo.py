"""`contextlog demo`: start ingest, push a scripted conversation with a tool call, show the log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import msgspec
import psycopg
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from contextlog.producers import ContextReader, Producer
from contextlog.schema import codec, keys
from contextlog.worker.app import bootstrap
from contextlog.worker.app.clock import SystemClock
from contextlog.worker.app.config import Settings
from contextlog.worker.cli import common as cli_common
from contextlog.worker.ingest import deadletters

AGENT = "demo-agent"
WAIT_SECONDS = 30.0


def script(producer: Producer, channel: str) -> list[str]:
    """A short support conversation: question, tool call, tool result, answer, clear."""
    with producer.batch() as b:
        b.post_message(AGENT, channel, "user", "What's the weather in Oslo?", sender="ada")
        b.post_message(
            AGENT,
            channel,
            "assistant",
            [
                {"type": "text", "text": "Let me look that up."},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
            ],
        )
        b.post_message(
            AGENT,
            channel,
            "user",
            [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "4°C, light rain"},
            ],
        )
        b.post_message(AGENT, channel, "assistant", "It's 4°C with light rain in Oslo.")
        b.post_message(AGENT, channel, "user", "Thanks!", sender="ada")
        b.configure(AGENT, channel, idle_timeout=600)
    return b.ids


def describe(kind: str, payload: dict[str, Any]) -> tuple[str, str]:
    """The role and a one-line summary of a stored event, for the table."""
    if kind != "message.v1":
        extra = {
            k: v
            for k, v in payload.items()
            if k in ("idle_timeout", "rolling_window", "token_budget", "description")
        }
        return "-", f"({kind.split('.')[0]}) {extra or ''}".strip()
    content = payload["content"]
    if isinstance(content, str):
        return payload["role"], content
    parts = []
    for block in content:
        if block["type"] == "text":
            parts.append(block["text"])
        elif block["type"] == "tool_use":
            parts.append(
                f"[tool_use {block['name']}({msgspec.json.encode(block['input']).decode()})]"
            )
        else:
            parts.append(f"[tool_result {block['tool_use_id']}: {block.get('content', '')}]")
    return payload["role"], " ".join(parts)


def wait_for(conn: psycopg.Connection[Any], ids: list[str]) -> list[tuple[Any, ...]]:
    """Poll until every event is stored (ingest runs in its own process)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        rows = conn.execute(
            "SELECT seq, kind, payload, recorded_at FROM events WHERE event_id = ANY(%s::uuid[])"
            " ORDER BY seq",
            (ids,),
        ).fetchall()
        conn.rollback()
        if len(rows) == len(ids) or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def run(settings: Settings, console: Console) -> int:
    """Run the demo; returns the process exit code."""
    console.print("[bold]1.[/bold] migrate the database")
    cli_common.check_servers(settings)  # before ingest starts, which would say it too
    console.print("[bold]2.[/bold] start [cyan]contextlog ingest[/cyan] in its own process")
    # Errors only: the demo shows the dead letter it provokes (step 5) itself, and ingest's
    # warning about it would land between the steps.
    env = {**os.environ, "CONTEXTLOG_LOG_LEVEL": "error"}
    ingest = subprocess.Popen(
        [sys.executable, "-m", "contextlog.worker.cli.main", "ingest"], env=env
    )
    try:
        return _show(settings, console, ingest)
    finally:
        if ingest.poll() is None:
            ingest.send_signal(signal.SIGTERM)
            code = ingest.wait(timeout=30)
            console.print(f"[bold]8.[/bold] ingest stopped on SIGTERM with exit code {code}")


def _show(settings: Settings, console: Console, ingest: subprocess.Popen[bytes]) -> int:
    producer = Producer.from_url(settings.redis_url, shards=settings.shards)
    channel = f"demo-{SystemClock().now():%Y%m%d-%H%M%S}"
    ids = script(producer, channel)
    console.print(f"[bold]3.[/bold] pushed {len(ids)} events for {AGENT}/{channel} in one pipeline")
    stream = keys.stream(keys.shard_of(AGENT, channel, settings.shards))
    producer.redis.xadd(stream, {codec.ENTRY_FIELD: b'{"type": "message.v1", "agent": 42}'})
    console.print("[bold]4.[/bold] pushed one malformed entry beside them")
    with bootstrap.pg_connector(settings)() as conn:
        rows = wait_for(conn, ids)
    table = Table(title=f"what landed in the events table: {AGENT}/{channel}")
    for col in ("seq", "kind", "role", "content"):
        table.add_column(col, overflow="fold")
    for seq, kind, payload, _ in rows:
        role, text = describe(kind, payload)
        table.add_row(str(seq), kind, role, escape(text))
    console.print(table)
    client: Any = producer.redis  # replies are bytes
    dead = deadletters.newest(client, producer.encoder.shards, 1)
    if dead:
        fields = {k.decode(): v.decode() for k, v in dead[0].fields.items()}
        console.print(
            f"[bold]5.[/bold] dead letter: reason=[yellow]{fields['reason']}[/yellow] "
            f"detail={fields['detail']!r}"
        )
    if len(rows) != len(ids):
        console.print(
            f"[red]only {len(rows)} of {len(ids)} events arrived in {WAIT_SECONDS}s[/red]"
        )
        return 1
    return _show_context(settings, console, producer, channel)


def _show_context(settings: Settings, console: Console, producer: Producer, channel: str) -> int:
    """What an adapter sends to the Messages API, then the same after `/context clear`."""
    reader = ContextReader.from_url(settings.database_url, **settings.reader_options())
    try:
        ctx = reader.context(AGENT, channel)
        console.print(
            f"[bold]6.[/bold] the context for anthropic.messages.create "
            f"(~{ctx.token_estimate} tokens):"
        )
        console.print_json(data=ctx.to_anthropic())
        cleared = producer.clear(AGENT, channel)
        after = reader.context(AGENT, channel, wait_for=cleared, timeout=WAIT_SECONDS)
    finally:
        reader.close()
    console.print(
        f"[bold]7.[/bold] after /context clear: {len(after.messages)} messages "
        "in the window (the log keeps them)"
    )
    return 0 if ctx.messages and not after.messages else 1
