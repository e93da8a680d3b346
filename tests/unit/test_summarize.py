"""Summaries: retries and failures against a fake Messages API, the local fallback, transcripts."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpcore2
import pytest
from structlog.testing import capture_logs

from contextlog.schema.events import MAX_TEXT
from contextlog.worker.tasks.deadline import Deadlines
from contextlog.worker.tasks.summarize import (
    FAILED_TEXT,
    TRUNCATED,
    AnthropicSummarizer,
    LocalSummarizer,
    Summarizer,
    Summary,
    make_client,
    storable,
    transcript,
)
from tests.support.fake_anthropic import (
    FakeAPI,
    FakeAPIServer,
    Outcome,
    check_request,
    client_for,
)

MODEL = "claude-test-1"

CHAT: list[tuple[str, Any]] = [
    ("user", "Can you find why the login page returns a 500 error"),
    (
        "assistant",
        [
            {"type": "text", "text": "Let me look at the logs."},
            {"type": "tool_use", "id": "tu_1", "name": "read_logs", "input": {"lines": 50}},
        ],
    ),
    (
        "user",
        [
            {
                "type": "tool_result",
                "tool_use_id": "tu_1",
                "content": [{"type": "text", "text": "KeyError: 'session_secret'"}],
                "is_error": False,
            }
        ],
    ),
    ("assistant", "The SESSION_SECRET setting is missing; I added it to the config"),
]


class Sleeps(list[float]):
    """A sleep that records the delays it was asked for and returns at once."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def fake() -> FakeAPI:
    return FakeAPI()


@pytest.fixture
def client(fake: FakeAPI) -> Iterator[anthropic.Anthropic]:
    with client_for(fake) as c:
        yield c


def summarizer(client: anthropic.Anthropic, sleeps: Sleeps, **kw: Any) -> AnthropicSummarizer:
    return AnthropicSummarizer(client, MODEL, sleep=sleeps, **kw)


def test_success_returns_the_text_of_a_well_formed_request(
    fake: FakeAPI, client: anthropic.Anthropic, sleeps: Sleeps
) -> None:
    fake.push(Outcome.ok("  Fixed the login bug by adding SESSION_SECRET.\n"))
    result = summarizer(client, sleeps).summarize(CHAT)
    assert result == Summary("Fixed the login bug by adding SESSION_SECRET.")
    assert (len(fake.requests), sleeps) == (1, [])
    body = fake.requests[0]
    assert check_request(body) == []
    assert (body["model"], body["max_tokens"]) == (MODEL, 400)
    assert [m["role"] for m in body["messages"]] == ["user"]
    assert isinstance(body["system"], str) and body["system"]
    assert fake.headers[0]["x-stainless-retry-count"] == "0"


def test_a_429_is_retried_after_its_retry_after(
    fake: FakeAPI, client: anthropic.Anthropic, sleeps: Sleeps
) -> None:
    fake.push(Outcome.error(429, retry_after=7), Outcome.ok("done"))
    assert summarizer(client, sleeps).summarize(CHAT) == Summary("done")
    assert (len(fake.requests), sleeps) == (2, [7.0])


def test_retry_after_is_capped_at_backoff_max(
    fake: FakeAPI, client: anthropic.Anthropic, sleeps: Sleeps
) -> None:
    fake.push(Outcome.error(429, retry_after=600), Outcome.error(503, retry_after=2))
    assert summarizer(client, sleeps, backoff_max=30).summarize(CHAT).text == fake.default.text
    assert sleeps == [30.0, 2.0]


def test_persistent_500_fails_after_exactly_attempts_requests(
    client: anthropic.Anthropic, sleeps: Sleeps, fake: FakeAPI
) -> None:
    fake.default = Outcome.error(500)
    with capture_logs() as logs:
        result = summarizer(client, sleeps, attempts=4, backoff=1.0).summarize(CHAT)
    assert result == Summary(FAILED_TEXT, failed=True)
    assert len(fake.requests) == 4
    assert sleeps == [1.0, 2.0, 4.0]
    assert [e["event"] for e in logs] == ["api.retry"] * 3 + ["summary.failed"]
    assert logs[-1]["error"] == "InternalServerError" and logs[-1]["status"] == 500
    assert "SESSION_SECRET" not in repr(logs) and "test-key" not in repr(logs)


def test_backoff_doubles_up_to_its_cap(
    fake: FakeAPI, client: anthropic.Anthropic, sleeps: Sleeps
) -> None:
    fake.default = Outcome.error(529)
    result = summarizer(client, sleeps, attempts=5, backoff=0.5, backoff_max=3).summarize(CHAT)
    assert result.failed
    assert sleeps == [0.5, 1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    "transient",
    [
        Outcome.error(500),
        Outcome.error(529),
        Outcome.timeout(),
        Outcome.disconnect(),
        Outcome.invalid_json(),
        Outcome.no_content(),
        Outcome.ok("   "),
    ],
    ids=["500", "529", "timeout", "disconnect", "invalid-json", "no-content", "blank-text"],
)
def test_a_transient_failure_is_retried_once_then_succeeds(
    fake: FakeAPI, client: anthropic.Anthropic, sleeps: Sleeps, transient: Outcome
) -> None:
    fake.push(transient, Outcome.ok("recovered"))
    assert summarizer(client, sleeps).summarize(CHAT) == Summary("recovered")
    assert (len(fake.requests), sleeps) == (2, [1.0])


@pytest.mark.parametrize(
    "persistent",
    [Outcome.timeout(), Outcome.invalid_json(), Outcome.no_content()],
    ids=["timeout", "invalid-json", "no-content"],
)
def test_a_persistent_transient_failure_ends_in_failed(
    fake: FakeAPI, client: anthropic.Anthropic, sleeps: Sleeps, persistent: Outcome
) -> None:
    fake.default = persistent
    result = summarizer(client, sleeps, attempts=3).summarize(CHAT)
    assert result == Summary(FAILED_TEXT, failed=True)
    assert (len(fake.requests), len(sleeps)) == (3, 2)


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_client_errors_are_not_retried(
    fake: FakeAPI, client: anthropic.Anthropic, sleeps: Sleeps, status: int
) -> None:
    fake.push(Outcome.error(status))
    with capture_logs() as logs:
        result = summarizer(client, sleeps).summarize(CHAT)
    assert result == Summary(FAILED_TEXT, failed=True)
    assert (len(fake.requests), sleeps) == (1, [])
    assert [(e["event"], e["status"]) for e in logs] == [("summary.failed", status)]


def test_the_prompt_carries_the_transcript_and_the_previous_summary(
    fake: FakeAPI, client: anthropic.Anthropic, sleeps: Sleeps
) -> None:
    s = summarizer(client, sleeps)
    s.summarize(CHAT)
    s.summarize(CHAT, previous="Earlier they set up CI.", purpose="compaction")
    plain, compaction = fake.prompts
    assert transcript(CHAT) in plain
    assert "Earlier they set up CI." not in plain and "2-4 sentences" in plain
    assert transcript(CHAT) in compaction
    assert "Earlier they set up CI." in compaction and "replace it" in compaction


def test_an_unknown_purpose_is_a_programming_error(client: anthropic.Anthropic) -> None:
    with pytest.raises(ValueError, match="purpose must be one of"):
        AnthropicSummarizer(client, MODEL).summarize(CHAT, purpose="sessoin")


def test_the_local_summary_is_deterministic_short_and_marked_local() -> None:
    local: Summarizer = LocalSummarizer()
    first = local.summarize(CHAT)
    assert first == local.summarize(list(CHAT)) and first.local and not first.failed
    assert first.text.startswith("[local summary]")
    assert 2 <= len(_sentences(first.text)) <= 4
    assert "1 tool call (read_logs)" in first.text
    assert '"Can you find why the login page returns a 500 error"' in first.text
    assert "SESSION_SECRET" in first.text  # the last message, quoted


def test_the_local_summary_shortens_quotes_and_folds_in_the_previous_one() -> None:
    chat = [("user", "word " * 100), ("assistant", "ok")]
    text = LocalSummarizer().summarize(chat, previous="They set up CI", purpose="compaction").text
    quoted = re.findall(r'"([^"]*)"', text)
    assert max(len(q) for q in quoted) <= 100 and quoted[0].endswith("…")
    assert "They set up CI" in text and text.startswith("[local summary] The earlier part")
    assert 2 <= len(_sentences(text)) <= 4


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [("user", "hello")],
        [("assistant", [])],
        [("user", [{"type": "tool_result", "tool_use_id": "x", "content": "out"}])],
        [("user", [{"type": "image", "source": {}}, "odd", 42]), ("assistant", None)],
    ],
    ids=["empty", "one-message", "empty-list", "only-tool-result", "odd-blocks"],
)
def test_the_local_summary_handles_sparse_and_odd_input(messages: list[tuple[str, Any]]) -> None:
    summary = LocalSummarizer().summarize(messages)
    assert summary.local and summary.text.startswith("[local summary]")
    assert 2 <= len(_sentences(summary.text)) <= 4


def test_transcript_renders_roles_tool_calls_and_results() -> None:
    text = transcript(CHAT)
    assert text.startswith("User: Can you find why")
    assert '[tool call read_logs {"lines": 50}]' in text
    assert "[tool result: KeyError: 'session_secret']" in text
    assert "Assistant: The SESSION_SECRET setting is missing" in text
    error = [("user", [{"type": "tool_result", "tool_use_id": "a", "is_error": True}])]
    assert transcript(error) == "User: [tool error: ]"


def test_transcript_keeps_head_and_tail_when_too_long() -> None:
    chat = [("user", "HEAD " + "x" * 5000), ("assistant", "y" * 5000 + " TAIL")]
    full = transcript(chat, limit_chars=10**6)
    cut = transcript(chat, limit_chars=1000)
    assert cut.startswith("User: HEAD") and cut.endswith("y TAIL")
    omitted = len(full) - 1000
    assert f"\n[... {omitted} characters omitted ...]\n" in cut
    assert len(cut) < 1100


def test_transcript_never_raises_on_odd_content() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    odd: list[tuple[str, Any]] = [
        ("user", None),
        ("system", 3.5),
        ("assistant", [{"type": "tool_use", "name": "t", "input": loop}]),
        ("assistant", [{"type": "tool_use", "input": {1: "a", "b": 2}}]),
        ("user", [{"no": "type"}, None]),
    ]
    text = transcript(odd, limit_chars=0)
    assert "characters omitted" in text
    assert "System: 3.5" in transcript(odd)


def test_a_real_socket_round_trip_through_make_client(sleeps: Sleeps) -> None:
    with FakeAPIServer(latency=0.05, text="Served over HTTP.") as server:
        with make_client("test-key", base_url=server.url, timeout=5.0) as client:
            result = AnthropicSummarizer(client, MODEL, sleep=sleeps).summarize(CHAT)
        assert result == Summary("Served over HTTP.")
        assert server.requests_served == 1
    assert sleeps == []


def _sentences(text: str) -> list[str]:
    """Sentences, ignoring the full stops inside quotes."""
    return [s for s in re.split(r"(?<=\.)\s+", re.sub(r'"[^"]*"', '""', text)) if s]


def test_a_dripping_server_cannot_hold_a_summary_past_its_total_budget() -> None:
    """Issue 10 item 7: one byte every 20 ms never trips a 1 s read timeout, and the
    answer (~400 bytes) would take ~8 s per try; the budget is the whole request's."""
    deadlines = Deadlines()
    slept: list[float] = []
    with FakeAPIServer(latency=0, drip=0.02) as server:
        client = make_client("k", base_url=server.url, timeout=1.0, deadlines=deadlines)
        summarizer = AnthropicSummarizer(
            client, "m", attempts=2, sleep=slept.append, deadlines=deadlines, budget=1.0
        )
        started = time.monotonic()
        summary = summarizer.summarize([("user", "hi")])
        elapsed = time.monotonic() - started
    assert summary.failed and summary.text == FAILED_TEXT  # marked failed after the retries
    assert len(slept) == 1  # retried once, on the injected sleep
    assert elapsed < 3.5, f"held {elapsed:.1f} s with a 1 s budget per try"


def test_the_budget_is_per_thread_and_absent_outside_a_request() -> None:
    now = [0.0]
    deadlines = Deadlines(monotonic=lambda: now[0])
    assert deadlines.cap(5.0, "read") == 5.0  # no budget set: untouched
    with deadlines.within(2.0):
        assert deadlines.cap(5.0, "read") == 2.0
        now[0] = 1.5
        assert deadlines.cap(None, "read") == 0.5
        now[0] = 2.0
        with pytest.raises(httpcore2.ReadTimeout):
            deadlines.cap(5.0, "read")
    assert deadlines.cap(5.0, "read") == 5.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain", ("plain", False)),
        ("a\x00b", ("ab", True)),
        ("x\ud800y", ("x?y", True)),
        ("z" * (MAX_TEXT + 5), ("z" * (MAX_TEXT - len(TRUNCATED)) + TRUNCATED, True)),
    ],
    ids=["plain", "nul", "lone-surrogate", "too-long"],
)
def test_answers_are_made_storable(text: str, expected: tuple[str, bool]) -> None:
    assert storable(text) == expected
    assert len(storable(text)[0]) <= MAX_TEXT
