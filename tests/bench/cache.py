"""Benchmark of prompt-cache friendliness: how much of each request the API could serve
from its cache, ours beside langchain-core's `trim_messages` on the same turns.

A scripted 1,000-turn conversation of a thinking, tool-using bot (every third turn calls
a tool; answers start with thinking), a second thread posting every third turn, a turn
every 2 minutes (33 hours: the 24 h window's edge is crossed), the default 16k budget.
Before each turn the context is read (`ContextReader.context`, then
`to_anthropic(system=, tools=, cache=True)`), and the peer trims the same window with
`trim_messages(strategy="last", start_on="human", include_system=True)` to the same
budget. Each request is flattened into its blocks in the API's cache order (tools,
system, then each message's blocks, `cache_control` removed); the cacheable part of a
request is the tokens of its longest run of leading blocks identical to the previous
request's. Tokens are our estimate (`estimate_tokens`) for both. Every request of both
is checked by the validity oracle (tests/support/anthropic_rules.py, thinking on).
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import time
from typing import Any, cast

import psycopg

from contextlog.producers import ContextReader
from contextlog.producers.context import estimate_tokens
from contextlog.producers.ids import uuid7
from contextlog.schema import codec
from contextlog.schema import events as ev
from contextlog.schema.defaults import ConversationDefaults
from contextlog.worker.store.eventlog import Accepted, PostgresEventLog
from tests.bench.harness import BenchEnv, Result
from tests.support.anthropic_rules import check_messages, check_params
from tests.support.blocks import SIGNATURE

TURNS = 1_000
START = dt.datetime(2026, 11, 20, 0, 0, tzinfo=dt.UTC)
GAP = dt.timedelta(minutes=2)
SYSTEM = "You are a helpful research assistant. " * 20
TOOLS = [
    {
        "name": name,
        "description": f"{name.replace('_', ' ')}: returns what it finds. " * 5,
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
    for name in ("search_docs", "get_weather", "run_query")
]
WORDS = tuple(
    [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "reading",
        "the",
        "logs",
    ]
)


def _text(i: int, n: int) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(n))


def _thinking(i: str) -> dict[str, Any]:
    return {
        "type": "thinking",
        "thinking": f"plan {i}: " + _text(len(i), 40),
        "signature": f"{SIGNATURE}{i}",
    }


def script(i: int) -> list[tuple[str, Any]]:
    """Turn i of the main thread: (role, content) as the bot posts them, after the user's."""
    out: list[tuple[str, Any]] = []
    if i % 3 == 0:
        tid = f"toolu_{i:04d}"
        out.append(
            (
                "assistant",
                [
                    _thinking(f"{i}a"),
                    {
                        "type": "tool_use",
                        "id": tid,
                        "name": TOOLS[i % 3]["name"],
                        "input": {"q": _text(i, 6)},
                    },
                ],
            )
        )
        out.append(
            ("user", [{"type": "tool_result", "tool_use_id": tid, "content": _text(i + 1, 60)}])
        )
    out.append(("assistant", [_thinking(f"{i}b"), {"type": "text", "text": _text(i, 90)}]))
    return out


class Log:
    """Appends events as ingest would (one transaction each), at scripted times."""

    def __init__(self, url: str) -> None:
        self.log = PostgresEventLog(psycopg.connect(url))
        self.n = 0

    def say(self, role: str, content: Any, at: dt.datetime, thread: str | None = None) -> None:
        self.n += 1
        event = ev.MessagePosted(
            event_id=uuid7(),
            agent="bench",
            channel="general",
            thread=thread,
            occurred_at=at,
            role=cast(Any, role),
            content=content,
        )
        payload = codec.encode(event)
        self.log.append(0, 1, [Accepted(f"{self.n}-0", codec.decode(payload), payload)])


def flatten(kw: dict[str, Any]) -> list[tuple[str, int]]:
    """The request as (block JSON, tokens) in cache order, without `cache_control`."""
    out = [(_canon(t), estimate_tokens(json.dumps(t))) for t in kw.get("tools", [])]
    system = kw.get("system") or []
    for b in [{"type": "text", "text": system}] if isinstance(system, str) else system:
        out.append((_canon(b), estimate_tokens(b["text"])))
    for m in kw["messages"]:
        content = m["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        out += [(m["role"] + _canon(b), estimate_tokens([b])) for b in blocks]
    return out


def marked(kw: dict[str, Any]) -> list[int]:
    """Positions (in `flatten` order) of the blocks that carry `cache_control`."""
    tools = kw.get("tools", [])
    system = kw.get("system") or []
    blocks = [*tools, *([] if isinstance(system, str) else system)]
    if isinstance(system, str):
        blocks.append({})
    for m in kw["messages"]:
        blocks += [{}] if isinstance(m["content"], str) else m["content"]
    return [i for i, b in enumerate(blocks) if "cache_control" in b]


class ApiCache:
    """The API's prompt cache as documented: a breakpoint writes the prefix up to it (if
    at least `minimum` tokens); a request reads the longest written prefix found at one
    of its breakpoints or up to 20 blocks before one. Entries live 5 minutes from their
    last use; turns here are 2 minutes apart, so expiry never applies."""

    LOOKBACK = 20

    def __init__(self, minimum: int = 1_024) -> None:
        self.minimum = minimum
        self.entries: set[int] = set()

    def serve(self, flat: list[tuple[str, int]], marks: list[int]) -> int:
        """Tokens of `flat` read from the cache; writes its breakpoints' prefixes."""
        hashes: list[int] = []
        sizes: list[int] = []
        run = 0
        for canon, n in flat:
            hashes.append(hash((hashes[-1] if hashes else 0, canon)))
            run += n
            sizes.append(run)
        hit = -1
        for b in marks:
            for j in range(b, max(-1, b - self.LOOKBACK), -1):
                if hashes[j] in self.entries:
                    hit = max(hit, j)
                    break
        self.entries.update(hashes[b] for b in marks if sizes[b] >= self.minimum)
        return sizes[hit] if hit >= 0 else 0


def _canon(block: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in block.items() if k != "cache_control"}, sort_keys=True)


def cacheable(prev: list[tuple[str, int]] | None, cur: list[tuple[str, int]]) -> int:
    """Tokens of the leading blocks `cur` shares with `prev`."""
    total = 0
    for a, b in zip(prev or [], cur, strict=False):
        if a[0] != b[0]:
            break
        total += b[1]
    return total


class Peer:
    """langchain-core's trim_messages over the same window, rendered as a request."""

    def __init__(self, budget: int) -> None:
        from langchain_core.messages import SystemMessage

        self.budget = budget
        self.history: list[tuple[dt.datetime, Any]] = []
        self.system = SystemMessage(SYSTEM)
        self.tokens: dict[int, int] = {id(self.system): estimate_tokens(SYSTEM)}

    def add(self, role: str, content: Any, at: dt.datetime) -> None:
        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        if role == "user" and blocks[0]["type"] == "tool_result":
            msg: Any = ToolMessage(blocks[0]["content"], tool_call_id=blocks[0]["tool_use_id"])
        else:
            msg = HumanMessage(blocks) if role == "user" else AIMessage(blocks)
        self.tokens[id(msg)] = estimate_tokens(blocks)
        self.history.append((at, msg))

    def request(self, now: dt.datetime, window: dt.timedelta) -> dict[str, Any]:
        from langchain_core.messages import ToolMessage, trim_messages

        recent = [m for at, m in self.history if at >= now - window]
        kept = trim_messages(
            [self.system, *recent],
            max_tokens=self.budget,
            token_counter=lambda ms: sum(self.tokens[id(m)] for m in ms),
            strategy="last",
            start_on="human",
            include_system=True,
        )
        messages: list[dict[str, Any]] = []
        for m in kept[1:]:
            if isinstance(m, ToolMessage):
                role, blocks = (
                    "user",
                    [{"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}],
                )
            else:
                role = "user" if m.type == "human" else "assistant"
                blocks = list(cast(Any, m.content))
            if messages and messages[-1]["role"] == role:
                messages[-1]["content"] += blocks
            else:
                messages.append({"role": role, "content": blocks})
        return {"tools": TOOLS, "system": SYSTEM, "messages": messages}


def run(env: BenchEnv) -> Result:
    """1,000 turns; the cacheable share of ours and of the peer."""
    turns = env.events or TURNS
    d = ConversationDefaults()
    reader = ContextReader.from_url(env.database_url, defaults=d)
    log, peer = Log(env.database_url), Peer(d.token_budget)
    window = dt.timedelta(seconds=d.rolling_window)
    stats: dict[str, dict[str, Any]] = {
        k: {"total": 0, "cached": 0, "invalid": 0, "over": 0, "shares": [], "starts": 0}
        for k in ("ours", "peer")
    }
    prev: dict[str, Any] = {"ours": None, "peer": None}
    api = ApiCache()
    served = 0
    read_ms: list[float] = []
    for i in range(turns):
        now = START + i * GAP
        if i % 3 == 1:
            log.say("user", f"side thread note {i} " + _text(i, 30), now, thread="side")
        question = f"question {i}: " + _text(i, 50)
        log.say("user", question, now)
        peer.add("user", question, now)
        t = time.perf_counter()
        ctx = reader.context("bench", "general", now=now)
        read_ms.append((time.perf_counter() - t) * 1000)
        requests = {
            "ours": ctx.to_anthropic(system=SYSTEM, tools=TOOLS, cache=True),
            "peer": peer.request(now, window),
        }
        for name, kw in requests.items():
            s = stats[name]
            flat = flatten(kw)
            size = sum(n for _, n in flat)
            if prev[name] is not None:
                got = cacheable(prev[name], flat)
                s["total"] += size
                s["cached"] += got
                s["shares"].append(got / size)
                s["starts"] += got < sum(n for _, n in prev[name])
            if name == "ours":
                read = api.serve(flat, marked(kw))
                served += read if prev[name] is not None else 0
            prev[name] = flat
            s["invalid"] += bool(check_params(kw) + check_messages(kw["messages"], thinking=True))
            tools_system = sum(n for _, n in flatten({**kw, "messages": []}))
            s["over"] += size - tools_system > d.token_budget
        for role, content in script(i):
            log.say(role, content, now + dt.timedelta(seconds=30))
            peer.add(role, content, now + dt.timedelta(seconds=30))
        if i % 100 == 99:
            print(
                f"  {i + 1} turns: ours {stats['ours']['cached'] / stats['ours']['total']:.3f}"
                f", peer {stats['peer']['cached'] / stats['peer']['total']:.3f}",
                flush=True,
            )
    reader.close()
    log.log.close()
    stats["ours"]["served"] = served
    return _result(turns, stats, read_ms)


def _result(turns: int, stats: dict[str, dict[str, Any]], read_ms: list[float]) -> Result:
    ours, peer = stats["ours"], stats["peer"]
    share = {k: s["cached"] / s["total"] for k, s in stats.items()}
    notes = [
        f"{label}: {share[name]:.3f} of input tokens cacheable over {turns - 1} requests "
        f"(median request {statistics.median(s['shares']):.3f}, "
        f"{sum(x < 0.5 for x in s['shares'])} requests under 0.5); the prefix broke "
        f"{s['starts']} times; {s['invalid']} requests refused by the oracle; "
        f"{s['over']} over the 16k budget (preamble + messages; tools and system on top); "
        f"{s['total'] / (turns - 1):,.0f} input tokens a request on average"
        for name, label, s in (("ours", "ours", ours), ("peer", "langchain-core", peer))
    ]
    notes.append(
        f"Served by our breakpoints (`cache=True`) under a model of the API's cache "
        f"(entries written at breakpoints of at least 1,024 tokens, read at a breakpoint "
        f"or up to 20 blocks before one): {ours['served'] / ours['total']:.3f} of input "
        f"tokens; the peer sets no breakpoints, so 0 for it as run."
    )
    notes.append(
        f"Our read (`ContextReader.context`) p50 {statistics.median(read_ms):.2f} ms, "
        f"max {max(read_ms):.2f} ms over the run (one process, local Postgres)."
    )
    return Result(
        name="cache",
        unit="% of input tokens cacheable",
        ours=100 * share["ours"],
        limit=100.0,
        limit_label="every input token of every request served from the cache (100%)",
        target=0.9,
        extra=(
            f"served by our breakpoints (API cache model) "
            f"{100 * ours['served'] / ours['total']:.1f}%; "
            f"peer (langchain-core trim_messages last/start_on=human) {100 * share['peer']:.1f}%; "
            f"invalid requests ours {ours['invalid']}, peer {peer['invalid']}; over budget "
            f"ours {ours['over']}, peer {peer['over']}"
        ),
        description=__doc__ or "",
        notes=notes,
        details={k: {kk: v for kk, v in s.items() if kk != "shares"} for k, s in stats.items()},
    )
