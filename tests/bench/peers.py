"""Benchmark "peers": contextlog beside what a bot builder would pick instead, in one run.

Peers (the `bench` extra, never a runtime dependency): langchain-postgres
`PostgresChatMessageHistory` with langchain-core `trim_messages` to the same 16k-token budget,
and LangGraph's `PostgresSaver`. Same message texts, same conversation sizes, same servers.
Every path runs in interleaved rounds (ours, peer, ours, peer, ...) so both see the same
machine load; each round's ratio is kept and the headline is their median.

- bot turn: post the user message + read the context (ours: `post_message` then
  `context(wait_for=id)` through a real `contextlog ingest`; peer: `add_messages` + `messages`
  + `trim_messages`), at 100 and 1,000 messages; the posted message must be the context's last
  (read-your-writes, checked every turn). The assistant's reply is posted untimed after each turn,
  then both sides pause 20 ms (think time).
- write stream: 100k messages over 1k conversations (ours: producer pipelines, timed from the
  first push to the last row committed by ingest; peer: one `add_messages` per conversation).
- read only: the context of a 1,000-message window (ours: `context()`; peer: LangGraph
  `PostgresSaver.get_tuple` of a checkpoint holding the same 1,000 messages).
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, trim_messages
from langchain_core.messages.utils import count_tokens_approximately
from langchain_postgres import PostgresChatMessageHistory
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import dict_row

from contextlog.producers import ContextReader, Producer
from contextlog.schema.defaults import TOKEN_BUDGET
from contextlog.schema.queries import query
from tests.bench.harness import (
    BenchEnv,
    BenchError,
    CpuMeter,
    Result,
    Watched,
    python_module,
    settle,
)

SHARDS = 4
SIZES = (100, 1000)
CONVERSATIONS = {100: 40, 1000: 8}  # turns rotate over these, so a window grows slowly
ROUNDS = 4  # per side and path; interleaved
TURNS = 60  # timed turns per round and size
# Untimed pause after each turn's reply, on both sides: a person takes seconds to answer,
# so a turn never starts while ingest still holds the previous reply (and 20 ms keeps
# the run short). Langchain's reply is written synchronously, so without it only our side
# would pay for the previous turn.
THINK_SECONDS = 0.02
READS = 100  # timed reads per round
STREAM_MESSAGES = 100_000
STREAM_CONVERSATIONS = 1_000
STREAM_ROUNDS = 4  # ~4 s a side each: cheap, and two rounds' median swung 0.8-1.2 here
PUSH_BATCH = 1000
TABLE = "lc_chat_history"


# What limits the bot turn (an ad-hoc turn loop, 250 turns with the bench's 20 ms pause,
# ingest's phases marked in its own process on the same monotonic clock; Postgres's
# statement durations from its log; 2026-11-23, AMD EPYC host, quiet); refreshed by hand.
LIMITS = (
    "Where a 100-message bot turn goes (p50, traced, quiet box, ~4.9 ms; langchain's "
    "~5.2 ms is add 1.7 + get 3.5 + trim 0.4 ms alone): the producer has XADD's answer "
    "at 0.9 ms and ingest has read the entry at 1.2 ms; its append starts at 1.5 ms "
    "(decode, fold, parameters) and has its answer at 3.6 ms: one statement, "
    "`contextlog_append` (012), its own transaction, of which Postgres logs bind 0.11 ms "
    "and execute 0.64 ms; the rest is the round trip from cold (a `SELECT 1` after a "
    "20 ms pause takes 0.52 ms here, 0.12 ms back to back) and the commit's WAL flush; "
    "the reader's rows arrive 0.65 ms after the commit (its wait and reads sat in "
    "Postgres: `contextlog_await_event`, 010; `window_tail`, 011; 1.0 ms before 013 "
    "let the planner inline the window's edge); decoding and `build_context` of the "
    "100 messages and attachments take the last 0.75 ms.",
    "What limits it is hops and waking up: each process on the path starts the turn cold "
    "after the think-time pause (the one-event append is 0.83 ms back to back but 2.5-2.7 "
    "ms after a 20 ms pause: `python -m tests.bench.append_latency --pause-ms 20`), and "
    "ours crosses producer, Redis, ingest, Postgres and reader where langchain's stays in "
    "one process. Round 0 is the slow one on our side: 40 of its 60 turns are the "
    "reader's first read of their conversation, with no tail hint (the whole window's "
    "payloads); later rounds read only what changed.",
    "What would move it: a reader that serves the posted message from the stream's "
    "pending entries while ingest stores it (a different read-your-writes contract, not "
    "started); a context built from the last read's instead of decoded and built afresh "
    "(~0.2 ms of CPU for 100 messages, ~0.6 ms cold; blocks handed to a caller must not "
    "be shared between reads, so it needs copy-on-write); fewer statements for the "
    "reader after the commit (three reads, one bind each).",
)


def _text(i: int) -> str:
    return f"message {i} " + "words " * 60


def _role(i: int) -> str:
    return "user" if i % 2 == 0 else "assistant"


def _lc(i: int, text: str | None = None) -> BaseMessage:
    body = text if text is not None else _text(i)
    return HumanMessage(body) if _role(i) == "user" else AIMessage(body)


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {"p50_ms": round(statistics.median(ordered), 3), "p99_ms": round(p99, 3)}


@dataclass
class Ours:
    """Our side: a producer, a reader and the running ingest process."""

    env: BenchEnv
    producer: Producer
    reader: ContextReader
    stored: psycopg.Connection[Any]

    def events_stored(self) -> int:
        return int(self.stored.execute(query("events_stored")).fetchone()[0])  # type: ignore[index]

    def wait_stored(self, count: int, timeout: float) -> None:
        deadline = time.perf_counter() + timeout
        while self.events_stored() < count:
            if time.perf_counter() > deadline:
                raise BenchError(f"ingest did not store {count:,} events in {timeout:.0f} s")
            time.sleep(0.002)

    def fill(self, agent: str, channel: str, size: int) -> None:
        with self.producer.batch() as b:
            for i in range(size):
                b.post_message(agent, channel, _role(i), _text(i))

    def turn(self, agent: str, channel: str, text: str) -> None:
        eid = self.producer.post_message(agent, channel, "user", text)
        ctx = self.reader.context(agent, channel, wait_for=eid, timeout=30)
        last = ctx.messages[-1]
        if last["role"] != "user" or last["content"][-1].get("text") != text:
            raise BenchError(f"read-your-writes broken: {text!r} is not the last message")

    def reply(self, agent: str, channel: str, text: str) -> None:
        self.producer.post_message(agent, channel, "assistant", text)


@dataclass
class LangChain:
    """The langchain-postgres side: one autocommit-off connection, as its docs show."""

    conn: psycopg.Connection[Any]

    def history(self, session: str) -> PostgresChatMessageHistory:
        return PostgresChatMessageHistory(TABLE, session, sync_connection=self.conn)

    def turn(self, session: str, text: str) -> None:
        history = self.history(session)
        history.add_messages([HumanMessage(text)])
        kept = trim_messages(
            history.messages,
            max_tokens=TOKEN_BUDGET,
            token_counter=count_tokens_approximately,
            strategy="last",
            start_on="human",
        )
        if kept[-1].content != text:
            raise BenchError(f"langchain read-your-writes broken for {text!r}")


def _session(agent: str, channel: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{agent}/{channel}"))


@contextmanager
def _ours(env: BenchEnv) -> Iterator[tuple[Ours, Watched]]:
    producer = Producer.from_url(env.redis_url, shards=SHARDS)
    reader = ContextReader.from_url(env.database_url)
    stored = psycopg.connect(env.database_url, autocommit=True)
    argv = python_module("contextlog.worker.cli.main", "ingest")
    penv = env.process_env(CONTEXTLOG_LOG_LEVEL="warning", CONTEXTLOG_SHARDS=str(SHARDS))
    try:
        with Watched("contextlog ingest", argv, penv) as ingest:
            ours = Ours(env, producer, reader, stored)
            ours.producer.post_message("warm", "up", "user", "hello")
            ours.wait_stored(1, 60)
            yield ours, ingest
    finally:
        producer.close()
        reader.close()
        stored.close()


def _fill(ours: Ours, lc: LangChain) -> None:
    """Conversations of 100 and 1,000 messages on both sides, plus the read-only one."""
    total = ours.events_stored()
    for size in SIZES:
        for c in range(CONVERSATIONS[size]):
            ours.fill("turn", f"w{size}-{c}", size)
            lc.history(_session("turn", f"w{size}-{c}")).add_messages([_lc(i) for i in range(size)])
            total += size
    ours.fill("read", "w1000", 1000)
    ours.wait_stored(total + 1000, 300)


def _bot_turns(ours: Ours, lc: LangChain, size: int) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    n = 0
    for r in range(ROUNDS):
        side: dict[str, list[float]] = {"ours": [], "langchain": []}
        for name in ("ours", "langchain"):
            for t in range(TURNS + 5):
                channel = f"w{size}-{(r * TURNS + t) % CONVERSATIONS[size]}"
                text = f"turn {r}.{t}.{n} from {name}: " + "question words " * 10
                n += 1
                start = time.perf_counter()
                if name == "ours":
                    ours.turn("turn", channel, text)
                else:
                    lc.turn(_session("turn", channel), text)
                elapsed = (time.perf_counter() - start) * 1000
                if t >= 5:  # warm-up
                    side[name].append(elapsed)
                reply = "answer words " * 20
                if name == "ours":
                    ours.reply("turn", channel, reply)
                else:
                    lc.history(_session("turn", channel)).add_messages([AIMessage(reply)])
                time.sleep(THINK_SECONDS)
        rounds.append(_round(side, "langchain"))
        print(f"  bot turn {size} msgs round {r}: {rounds[-1]}", flush=True)
    return _summarise(rounds, "langchain")


def _round(side: dict[str, list[float]], peer: str) -> dict[str, Any]:
    """One round: each side's percentiles and the ratios of ours to the peer's."""
    o, p = _percentiles(side["ours"]), _percentiles(side[peer])
    return {
        "ours": o,
        peer: p,
        "p50_ratio": round(o["p50_ms"] / p["p50_ms"], 3),
        "p99_ratio": round(o["p99_ms"] / p["p99_ms"], 3),
    }


def _summarise(rounds: list[dict[str, Any]], peer: str) -> dict[str, Any]:
    """Per-round figures, plus the median of each side and of the per-round ratios."""
    out: dict[str, Any] = {"rounds": rounds}
    for s in ("p50", "p99"):
        out[f"median_{s}_ratio"] = round(statistics.median(r[f"{s}_ratio"] for r in rounds), 3)
        for side, key in (("ours", "ours"), ("peer", peer)):
            out[f"{side}_median_{s}_ms"] = round(
                statistics.median(r[key][f"{s}_ms"] for r in rounds), 3
            )
    return out


def _stream_ours(ours: Ours, r: int, count: int, conversations: int) -> float:
    base = ours.events_stored()
    per = count // conversations
    start = time.perf_counter()
    pushed = 0
    while pushed < count:
        with ours.producer.batch() as b:
            for k in range(pushed, min(count, pushed + PUSH_BATCH)):
                c, i = k % conversations, k // conversations
                b.post_message(f"stream{r}", f"c{c}", _role(i % per), _text(i))
        pushed = min(count, pushed + PUSH_BATCH)
    ours.wait_stored(base + count, 60 + count / 500)
    return count / (time.perf_counter() - start)


def _stream_langchain(lc: LangChain, r: int, count: int, conversations: int) -> float:
    per = count // conversations
    batch = [_lc(i) for i in range(per)]
    start = time.perf_counter()
    for c in range(conversations):
        lc.history(_session(f"stream{r}", f"c{c}")).add_messages(batch)
    return per * conversations / (time.perf_counter() - start)


def _write_stream(ours: Ours, lc: LangChain, count: int) -> dict[str, Any]:
    conversations = min(STREAM_CONVERSATIONS, max(1, count // 100))
    count = count // conversations * conversations
    rounds: list[dict[str, Any]] = []
    for r in range(STREAM_ROUNDS):
        cpu = CpuMeter()
        o = _stream_ours(ours, r, count, conversations)
        mid = cpu.report()
        cpu = CpuMeter()
        p = _stream_langchain(lc, r, count, conversations)
        rounds.append(
            {
                "ours_msg_per_s": round(o, 1),
                "langchain_msg_per_s": round(p, 1),
                "ratio": round(o / p, 3),
                "ours_cpu": mid,
                "langchain_cpu": cpu.report(),
            }
        )
        print(f"  write stream round {r}: {o:,.0f} vs {p:,.0f} msg/s", flush=True)
    return {
        "messages": count,
        "conversations": conversations,
        "rounds": rounds,
        "median_ratio": round(statistics.median(r["ratio"] for r in rounds), 3),
        "ours_median_msg_per_s": round(statistics.median(r["ours_msg_per_s"] for r in rounds), 1),
        "langchain_median_msg_per_s": round(
            statistics.median(r["langchain_msg_per_s"] for r in rounds), 1
        ),
    }


def _saver_fill(saver: PostgresSaver, thread: str, size: int) -> dict[str, Any]:
    config: dict[str, Any] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    version = saver.get_next_version(None, None)
    checkpoint["channel_values"] = {"messages": [_lc(i) for i in range(size)]}
    checkpoint["channel_versions"] = {"messages": version}
    saver.put(config, checkpoint, {"source": "input", "step": 1}, {"messages": version})  # type: ignore[arg-type]
    return config


def _read_only(ours: Ours, saver: PostgresSaver, config: dict[str, Any]) -> dict[str, Any]:
    rounds = []
    for r in range(ROUNDS):
        side: dict[str, list[float]] = {"ours": [], "langgraph": []}
        reads: list[tuple[str, Callable[[], int]]] = [
            ("ours", lambda: len(ours.reader.context("read", "w1000").messages)),
            ("langgraph", lambda: len(_messages(saver.get_tuple(config)))),  # type: ignore[arg-type]
        ]
        for name, read in reads:
            for i in range(READS + 5):
                start = time.perf_counter()
                got = read()
                elapsed = (time.perf_counter() - start) * 1000
                if i >= 5:
                    side[name].append(elapsed)
            if got == 0:
                raise BenchError(f"{name} read returned no messages")
        rounds.append(_round(side, "langgraph"))
        print(f"  read-only round {r}: {rounds[-1]}", flush=True)
    return _summarise(rounds, "langgraph")


def _messages(t: Any) -> list[Any]:
    return list(t.checkpoint["channel_values"]["messages"]) if t is not None else []


def _measure(env: BenchEnv) -> dict[str, Any]:
    lc_conn = psycopg.connect(env.database_url)
    PostgresChatMessageHistory.create_tables(lc_conn, TABLE)
    saver_conn = psycopg.connect(env.database_url, autocommit=True, row_factory=dict_row)
    saver = PostgresSaver(saver_conn)
    saver.setup()
    lc = LangChain(lc_conn)
    measured: dict[str, Any] = {"load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    try:
        with _ours(env) as (ours, ingest):
            _fill(ours, lc)
            config = _saver_fill(saver, "read-w1000", 1000)
            settle()  # the set-up's objects stay for the run
            for size in SIZES:
                measured[f"bot_turn_{size}"] = _bot_turns(ours, lc, size)
            measured["read_only_1000"] = _read_only(ours, saver, config)
            measured["write_stream"] = _write_stream(ours, lc, env.events or STREAM_MESSAGES)
            ingest.sample()
    finally:
        lc_conn.close()
        saver_conn.close()
    measured["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return measured


def _line(label: str, m: dict[str, Any], stat: str, peer: str) -> str:
    ratio = m[f"median_{stat}_ratio"]
    verdict = "faster" if ratio < 1 else "even" if ratio == 1 else "slower"
    return (
        f"{label} {stat}: ours {m[f'ours_median_{stat}_ms']:.2f} ms, {peer} "
        f"{m[f'peer_median_{stat}_ms']:.2f} ms; median of per-round ratios {ratio:.2f} "
        f"({verdict}; rounds " + ", ".join(f"{r[f'{stat}_ratio']:.2f}" for r in m["rounds"]) + ")"
    )


def _stream_cpu_line(ws: dict[str, Any]) -> str:
    """What bounds the write stream on this machine: the CPU each side spends a message
    (every process on the machine: producer, Redis, ingest, Postgres; or langchain and
    Postgres), measured per round, and the rate the machine's cores allow at that cost."""
    cores = ws["rounds"][0]["ours_cpu"]["cores"]
    per: dict[str, float] = {}
    for side in ("ours", "langchain"):
        per[side] = statistics.median(
            r[f"{side}_cpu"]["machine_busy_cpu_seconds"] / ws["messages"] * 1e6
            for r in ws["rounds"]
        )
    return (
        f"What limits the write stream: machine CPU a message, ours {per['ours']:.0f} us "
        f"(the message is validated by the producer and by ingest, written to Redis, a "
        f"stream's batch by one script call, and then to Postgres), langchain "
        f"{per['langchain']:.0f} us (one multi-row INSERT a conversation); at that cost "
        f"{cores:.0f} cores allow ours at most "
        f"~{cores / per['ours'] * 1e6:,.0f} msg/s even fully busy, where 1.5x langchain is "
        f"{1.5 * ws['langchain_median_msg_per_s']:,.0f}. What would move it: less CPU a "
        "message in the producer and ingest (the ingest row's profile), and cores: on a "
        "bigger machine producers, ingest processes and Postgres each get their own, while "
        "the peer as run here writes from one thread."
    )


def run(env: BenchEnv) -> Result:
    """All three paths, interleaved rounds, against the peers."""
    m = _measure(env)
    t100, t1000 = m["bot_turn_100"], m["bot_turn_1000"]
    ws, ro = m["write_stream"], m["read_only_1000"]
    lc = "langchain add+get+trim"
    notes = [
        _line("Bot turn, 100 msgs,", t100, "p50", lc),
        _line("Bot turn, 100 msgs,", t100, "p99", lc),
        _line("Bot turn, 1,000 msgs,", t1000, "p50", lc),
        _line("Bot turn, 1,000 msgs,", t1000, "p99", lc),
        f"Write stream, {ws['messages']:,} msgs over {ws['conversations']:,} conversations, "
        f"push to last row committed: ours {ws['ours_median_msg_per_s']:,.0f} msg/s, langchain "
        f"`add_messages` per conversation {ws['langchain_median_msg_per_s']:,.0f} msg/s; median "
        f"ratio {ws['median_ratio']:.2f} (target ≥ 1.5; rounds "
        + ", ".join(f"{r['ratio']:.2f}" for r in ws["rounds"])
        + ").",
        _stream_cpu_line(ws),
        _line("Read only, 1,000-msg window,", ro, "p50", "LangGraph `get_tuple`"),
        _line("Read only, 1,000-msg window,", ro, "p99", "LangGraph `get_tuple`"),
        f"Machine load average (1/5/15 min) at start {m['load_average_at_start']}, at end "
        f"{m['load_average_at_end']}; write-stream CPU per round in the JSON.",
        f"Rounds: {ROUNDS} per side for turns and reads ({TURNS} turns / {READS} reads each), "
        f"{STREAM_ROUNDS} for the write stream; turns rotate over "
        f"{CONVERSATIONS[100]} / {CONVERSATIONS[1000]} conversations so a window grows by "
        f"~{2 * ROUNDS * TURNS // CONVERSATIONS[100]} / "
        f"~{2 * ROUNDS * TURNS // CONVERSATIONS[1000]} messages over the run.",
        *LIMITS,
    ]
    return Result(
        name="peers",
        unit="turns/s (100-msg p50, inverse)",
        ours=1000 / t100["ours_median_p50_ms"],
        limit=1000 / t100["peer_median_p50_ms"],
        limit_label="the fastest peer: langchain-postgres add_messages + messages + trim_messages "
        "(bot turn, 100-message conversation, p50)",
        target=1.0,
        extra=(
            f"bot turn p50/p99 ratio 100 msgs {t100['median_p50_ratio']:.2f}/"
            f"{t100['median_p99_ratio']:.2f}, 1,000 msgs {t1000['median_p50_ratio']:.2f}/"
            f"{t1000['median_p99_ratio']:.2f} (ours/peer, ≤ 1 wins); write stream "
            f"{ws['median_ratio']:.2f}x langchain; read 1,000 p50 {ro['median_p50_ratio']:.2f}x "
            "LangGraph"
        ),
        description=(
            "contextlog against langchain-postgres 0.0.19 (`PostgresChatMessageHistory` + "
            "langchain-core `trim_messages`, 16k-token budget) and LangGraph "
            "`PostgresSaver` 3.2.0 on the same servers, in interleaved rounds (ours, peer, "
            "ours, peer): a bot turn (post the user message + read the context, "
            "read-your-writes checked every turn; the reply is posted untimed, then 20 ms of "
            "think time on both sides), the write stream, and a read-only window."
        ),
        notes=notes,
        details=m,
    )
