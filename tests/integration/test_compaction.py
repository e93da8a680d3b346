"""Compaction in the background, end to end: ingest queues it when a segment passes half
its budget, the worker runs it (the API's on-demand compaction where the conversation's
model has it, our summary otherwise), and the result lands as an event."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue

from contextlog.schema import events as ev
from contextlog.schema import notices as nt
from contextlog.worker.app import bootstrap
from contextlog.worker.tasks import compaction, jobs
from contextlog.worker.tasks.compaction import ApiCompactor
from contextlog.worker.tasks.queue import SUMMARIES, Jobs
from contextlog.worker.tasks.summarize import LocalSummarizer, Retry
from tests.integration.test_sessions import texts
from tests.support.anthropic_rules import check_messages
from tests.support.fake_anthropic import FakeAPI, Outcome, client_for
from tests.support.running import eventually
from tests.support.session_stack import A, C, Stack
from tests.support.thinking_bot import MODEL, SYSTEM, TOOLS, Bot

WORDS = "the deploy pipeline caches layers keyed by the lockfile hash " * 3  # ~48 tokens


def test_our_summary_lands_at_the_next_opening_message_as_a_boundary(
    stack: Stack, rds: redis.Redis
) -> None:
    """No API compaction for this model: our summary of the older part lands at the next
    user message that opens an exchange, never inside a tool-use cycle."""
    stack.use(LocalSummarizer())
    stack.producer.configure(A, C, token_budget=400, source="test")
    for i in range(2):
        stack.say(f"q{i} {WORDS}")
        stack.say(f"a{i} {WORDS}", "assistant")
    stack.stored(stack.say(f"q2 {WORDS}"))  # past half the budget: a compaction is queued
    eventually(lambda: Queue(SUMMARIES, connection=rds).count >= 1, what="the compaction job")
    assert Queue(SUMMARIES, connection=rds).count == 1  # one compaction job, not one per batch
    assert not Jobs(rds).compact(A, C)  # a second one is refused while it is queued
    stack.run_jobs()
    compacted = stack.notice(nt.CONTEXT_COMPACTED)  # the adapter hears of it
    assert compacted.text is not None and compacted.text.startswith("compacted the conversation")
    before = stack.reader.context(A, C)
    assert not before.compacted  # not yet: it waits for the next opening message
    stack.say(f"a2 {WORDS}", "assistant")
    stack.stored(stack.say(f"q3 {WORDS}"))
    ctx = stack.reader.context(A, C)
    assert ctx.compacted and ctx.boundary is not None and ctx.boundary.kind == "summary"
    assert ctx.system is not None and "Summary of the earlier part" in ctx.system
    assert [t.split()[0] for t in texts(ctx.messages)] == ["q2", "a2", "q3"]
    assert check_messages(ctx.messages) == []


def _api_stack(stack: Stack) -> FakeAPI:
    api = FakeAPI()
    retry = Retry(attempts=3, sleep=stack.delays.append)
    stack.use(LocalSummarizer(), ApiCompactor(client_for(api), retry))
    thinking = {"type": "adaptive"}
    stack.producer.set_frame(
        A, C, model=MODEL, system=SYSTEM, tools=TOOLS, thinking=thinking, source="test"
    )
    return api


def _bot(stack: Stack, api: FakeAPI) -> Bot:
    def post(role: str, content: Any, thread: str | None = None) -> str:
        eid = stack.producer.post_message(A, C, role, content, thread=thread, source="test")
        stack.stored(eid)
        return eid

    return Bot(post, stack.reader, api)


def test_the_apis_compaction_lands_in_the_background_and_keeps_thinking(
    stack: Stack, rds: redis.Redis
) -> None:
    """The worker compacts with the API on the conversation's own model, system and
    tools; turns posted while it ran follow the block unchanged; the bot's next request
    starts with the block, sends the kept thinking back, and is accepted."""
    api = _api_stack(stack)
    stack.producer.configure(A, C, token_budget=3000, source="test")
    bot = _bot(stack, api)
    res = bootstrap.resources()
    turns = 0
    while not jobs.threads_to_compact(res, A, C):  # past half the budget
        assert bot.turn(f"question {turns} {WORDS}", tools=1 if turns % 3 == 1 else 0)
        turns += 1
    [(thread, previous)] = jobs.threads_to_compact(res, A, C)
    p = compaction.plan(res.reader, A, C, thread)
    assert p is not None
    assert bot.turn(f"asked while it ran {WORDS}")  # the conversation goes on meanwhile
    event = jobs.compaction_event(res, p, previous)
    assert event is not None and ev.given(event.block)
    request = next(r for r in reversed(api.requests) if r.get("compaction"))
    assert request["model"] == MODEL and request["tools"] == TOOLS
    assert request["system"] == SYSTEM and request["thinking"] == {"type": "adaptive"}
    stack.stored(res.producer.push(event))
    ctx = stack.reader.context(A, C)
    assert ctx.compacted and ctx.boundary is not None and ctx.boundary.kind == "compaction"
    assert ctx.messages[0]["content"][0]["type"] == "compaction"
    assert ctx.thinking_removed == 0  # the API wrote the summary: thinking stays valid
    assert any("asked while it ran" in str(m["content"]) for m in ctx.messages)
    assert bot.turn("and after it landed"), bot.stats.errors  # the API accepts it all
    assert bot.stats.refused == 0


def test_without_a_block_from_the_api_our_summary_does_it(stack: Stack) -> None:
    """A refusal, a cut-off or empty summary, retries run out: our summarizer writes it."""
    api = _api_stack(stack)
    bot = _bot(stack, api)
    for i in range(6):
        assert bot.turn(f"question {i} {WORDS}")
    res = bootstrap.resources()
    previous = None
    p = compaction.plan(res.reader, A, C, "")
    assert p is not None
    for outcomes in (
        [Outcome.ok(None)],  # a null summary: the API's no-op
        [Outcome.stop("max_tokens")],
        [Outcome.error(400)],
        [Outcome.error(529, code="compaction_unavailable")] * 3,
    ):
        api.push(*outcomes)
        event = jobs.compaction_event(res, p, previous)
        assert event is not None and not ev.given(event.block) and event.local, outcomes
    assert stack.delays  # the 529s were retried with backoff


def test_other_models_get_our_summary(stack: Stack) -> None:
    api = _api_stack(stack)
    stack.producer.set_frame(A, C, model="claude-haiku-5-5", system=SYSTEM, source="test")
    for i in range(6):
        stack.say(f"q{i} {WORDS}")
        stack.stored(stack.say(f"a{i} {WORDS}", "assistant"))
    res = bootstrap.resources()
    stack.stored(stack.say("one more"))
    p = compaction.plan(res.reader, A, C, "")
    assert p is not None and p.context.frame is not None
    event = jobs.compaction_event(res, p, None)
    assert event is not None and not ev.given(event.block)
    assert not any(r.get("compaction") for r in api.requests)


def test_a_compaction_overtaken_by_a_boundary_is_ignored(stack: Stack) -> None:
    stack.use(LocalSummarizer())
    for i in range(3):
        stack.say(f"q{i} {WORDS}")
        stack.stored(stack.say(f"a{i} {WORDS}", "assistant"))
    res = bootstrap.resources()
    p = compaction.plan(res.reader, A, C, "")
    assert p is not None
    event = compaction.summary_event(p, LocalSummarizer(), None, res.clock.now())
    assert event is not None
    stack.producer.clear(A, C, source="test")
    stack.stored(res.producer.push(event))
    stack.stored(stack.say("fresh"))
    ctx = stack.reader.context(A, C)
    assert not ctx.compacted and texts(ctx.messages) == ["fresh"]


def test_a_compaction_block_posted_by_the_adapter_starts_the_context(stack: Stack) -> None:
    """Server-side compaction: the answer starts with the API's block; nothing before it
    is sent again, and a null block (no summary) is a no-op kept where it is."""
    stack.say("old question")
    stack.say("old answer", "assistant")
    stack.say("next")
    block = {"type": "compaction", "content": "We set up the pipeline."}
    answer = [block, {"type": "text", "text": "Done."}]
    stack.stored(stack.say(answer, "assistant"))  # type: ignore[arg-type]
    stack.stored(stack.say("thanks"))
    ctx = stack.reader.context(A, C)
    assert ctx.messages[0] == {"role": "assistant", "content": answer}
    assert ctx.compacted and check_messages(ctx.messages) == []
    assert ctx.boundary is not None and ctx.boundary.kind == "compaction"
    null = {"type": "compaction", "content": None}
    stack.stored(stack.say([null, {"type": "text", "text": "ok"}], "assistant"))  # type: ignore[arg-type]
    assert stack.reader.context(A, C).messages[0] == {"role": "assistant", "content": answer}


def test_system_messages_and_compaction_blocks_are_saved_as_posted(stack: Stack) -> None:
    block = {"type": "compaction", "content": "Earlier: setup.", "signature": "c2ln"}
    stack.say("q")
    stack.say([block, {"type": "text", "text": "a"}], "assistant")  # type: ignore[arg-type]
    stack.stored(stack.say("Today is Tuesday.", "system"))
    _info, messages = stack.reader.session_messages(_save(stack), agent=A, channel=C)
    assert [m.role for m in messages] == ["user", "assistant", "system"]
    assert messages[1].content[0] == block


def test_system_messages_compaction_and_thinking_round_trip_through_export_and_import(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Posted, exported, imported elsewhere and restored: every block as posted; the
    restore removes the thinking (its prefix is gone) and says so."""
    from contextlog.worker.cli import main as cli

    block = {"type": "compaction", "content": "Earlier: setup.", "signature": "c2ln"}
    thinking = {"type": "thinking", "thinking": "", "signature": "c2lnbmF0dXJl"}
    stack.say("q")
    stack.say([block, thinking, {"type": "text", "text": "a"}], "assistant")  # type: ignore[arg-type]
    stack.say("next")
    stack.stored(stack.say([{"type": "text", "text": "Be brief."}], "system"))  # type: ignore[arg-type]
    sid = _save(stack)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["export", sid, "--agent", A, "--channel", C]) == 0
    argv = ["import", str(tmp_path / f"{sid}.json"), "--agent", A, "--channel", "dm"]
    assert cli.main([*argv, "--source", "test"]) == 0
    stack.notice(nt.SESSION_IMPORTED)
    _info, messages = stack.reader.session_messages(sid, agent=A, channel="dm")
    assert [m.role for m in messages] == ["user", "assistant", "user", "system"]
    assert messages[1].content == [block, thinking, {"type": "text", "text": "a"}]
    stack.producer.restore(A, "dm", sid, source="test")
    stack.notice(nt.RESTORE_DONE)
    ctx = stack.reader.context(A, "dm")
    assert ctx.messages == [
        {"role": "assistant", "content": [block, {"type": "text", "text": "a"}]},
        {"role": "user", "content": [{"type": "text", "text": "next"}]},
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    ]
    assert ctx.thinking_removed == 1 and check_messages(ctx.messages) == []


def _save(stack: Stack) -> str:
    stack.producer.save(A, C, "with blocks", source="test")
    return str(stack.notice(nt.SESSION_SAVED).session_id)
