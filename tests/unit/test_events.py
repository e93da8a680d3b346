"""The event contract: round trips and every kind of bad input, with its reason."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import unicodedata
import uuid
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextlog.producers.history import page_params
from contextlog.producers.reader import read_params
from contextlog.schema import codec
from contextlog.schema import events as ev
from contextlog.schema.defaults import ConversationDefaults
from contextlog.schema.errors import EventRejected, EventTooLarge

T0 = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
EID = "01a20134-0bd6-74d9-a389-a82c876e4360"


def raw(**overrides: Any) -> bytes:
    body: dict[str, Any] = {
        "type": "message.v1",
        "event_id": EID,
        "agent": "alpha",
        "channel": "general",
        "occurred_at": "2026-11-22T12:00:00Z",
        "role": "user",
        "content": "hi",
    }
    body.update(overrides)
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


def reason_of(data: bytes, max_bytes: int = codec.DEFAULT_MAX_ENTRY_BYTES) -> str:
    with pytest.raises(EventRejected) as info:
        codec.decode(data, max_bytes)
    return info.value.reason


COMMON: dict[str, Any] = {
    "event_id": uuid.UUID(EID),
    "agent": "alpha",
    "channel": "general",
    "occurred_at": T0,
}


def raw_blocks(*blocks: msgspec.Struct) -> list[msgspec.Raw]:
    """Blocks as a message carries them: the JSON posted."""
    return [msgspec.Raw(msgspec.json.encode(b)) for b in blocks]


EXAMPLES: list[ev.Event] = [
    ev.MessagePosted(
        role="user",
        content="hello",
        thread="t1",
        sender="ada",
        source="discord",
        external_id="123",
        **COMMON,
    ),
    ev.MessagePosted(
        role="assistant",
        content=raw_blocks(
            ev.TextBlock(text="looking"),
            ev.ToolUseBlock(
                id="toolu_1", name="get_weather", input=msgspec.Raw(b'{"city":"Oslo"}')
            ),
        ),
        **COMMON,
    ),
    ev.MessagePosted(
        role="user",
        content=raw_blocks(
            ev.ToolResultBlock(
                tool_use_id="toolu_1", content=raw_blocks(ev.TextBlock(text="4C")), is_error=True
            ),
        ),
        **COMMON,
    ),
    ev.ContextCleared(**COMMON),
    ev.SessionSaveRequested(description="auth refactor", provider="anthropic", model="m", **COMMON),
    ev.SummaryGenerated(session_id="2026-11-22_auth", summary="Done.", local=True, **COMMON),
    ev.ContextCompacted(through_seq=41, summary="Earlier: setup.", thread="t1", **COMMON),
    ev.MessageImported(
        import_id=uuid.UUID(int=7),
        role="user",
        content="hi",
        original_at=COMMON["occurred_at"],
        **COMMON,
    ),
    ev.SessionImported(
        import_id=uuid.UUID(int=7), session_id="2026-11-20_x", message_count=1, **COMMON
    ),
    ev.SessionRestoreRequested(session_id="last", **COMMON),
    ev.SessionDeleteRequested(session_id="2026-11-22_auth-refactor", **COMMON),
    ev.SessionsPurgeRequested(keep=3, **COMMON),
    ev.Configured(rolling_window=3600, idle_timeout=0, token_budget=8000, **COMMON),
    ev.FrameSet(
        model="claude-fable-5-1",
        system=raw_blocks(ev.TextBlock(text="You are a bot.")),
        tools=[msgspec.Raw(b'{"name": "lookup", "input_schema": {"type": "object"}}')],
        **COMMON,
    ),
    ev.MessagePosted(role="system", content="Today is Tuesday.", **COMMON),
    ev.SearchRequested(query='"roll back" deploy*', page=2, **COMMON),
    ev.EraseRequested(
        erase_id=uuid.UUID(int=9), scope="sender", subject="ab" * 32, shard=1, shards=4, **COMMON
    ),
    ev.RetentionSet(keep_log_days=90, keep_sessions_days=0, **COMMON),
    ev.SessionsExpired(before=T0, **COMMON),
]


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: ev.kind_of(e))
def test_every_event_type_round_trips(event: ev.Event) -> None:
    # Content blocks come back as the raw JSON posted: compare what goes on the wire.
    assert codec.encode(codec.decode(codec.encode(event))) == codec.encode(event)


def test_tags_are_versioned_and_unique() -> None:
    tags = [ev.kind_of(e) for e in EXAMPLES]
    assert all(t.endswith(".v1") for t in tags)
    assert len({ev.kind_of(e) for e in EXAMPLES}) == len(ev.EVENT_TYPES)


@given(
    text=st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=300),
    thread=st.none()
    | st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=ev.MAX_NAME),
)
def test_any_text_without_nul_round_trips_and_a_name_only_with_refused_characters_is_refused(
    text: str, thread: str | None
) -> None:
    # Which names are refused is the contract's own rule (`codec.refused_in_name`), not a
    # second copy of it here: a draw can only fail where decoding breaks that rule.
    event = ev.MessagePosted(role="user", content=text, thread=thread, **COMMON)
    if thread is not None and codec.refused_in_name(thread) is not None:
        assert reason_of(codec.encode(event)) == codec.INVALID  # U+0000 is named as such
    else:
        assert codec.decode(codec.encode(event)) == event


def test_a_read_of_a_name_no_event_can_hold_is_refused_not_looked_up() -> None:
    # Postgres cannot even take U+0000: the reader must refuse it as the contract does.
    defaults = ConversationDefaults()
    with pytest.raises(EventRejected, match="in `thread`"):
        read_params("alpha", "general", "t\x00", defaults)
    with pytest.raises(EventRejected, match=r"U\+200B .* in `channel`"):
        page_params("alpha", "gen\u200beral", 1, 10)
    assert read_params("alpha", "general", "t é", defaults)["thread"] == "t é"


def test_oversized_entry_is_rejected_before_decoding() -> None:
    # Not even valid JSON: the size cap must answer first.
    with pytest.raises(EventTooLarge) as info:
        codec.decode(b"{" * 2000, max_bytes=1024)
    assert info.value.reason == codec.OVERSIZED
    assert "2000 bytes" in info.value.detail


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{not json", codec.MALFORMED),
        (b"", codec.MALFORMED),
        (b"\xff\xfe", codec.MALFORMED),
        (raw(type="message.v9"), codec.UNKNOWN_TYPE),
        (raw(type=...), codec.UNKNOWN_TYPE),
        (b"[1, 2]", codec.INVALID),
        (raw(role="developer"), codec.INVALID),
        (raw(role="system", content=[{"type": "image", "source": {}}]), codec.INVALID),
        (raw(agent=""), codec.INVALID),
        (raw(agent="a" * 201), codec.INVALID),
        (raw(channel="gen\neral"), codec.INVALID),
        (raw(event_id="not-a-uuid"), codec.INVALID),
        (raw(occurred_at="2026-11-22T12:00:00"), codec.INVALID),  # no timezone
        (raw(content=[]), codec.INVALID),
        (raw(content=[{"type": "text", "text": "x"}] * 257), codec.INVALID),
        (raw(content="x" * 200_001), codec.INVALID),
        (raw(content=[{"type": "image", "source": {}}]), codec.INVALID),
        (raw(content=[{"type": "tool_use", "id": "t 1", "name": "x", "input": {}}]), codec.INVALID),
        (raw(content=[{"type": "tool_use", "id": "t1", "name": "x", "input": [1]}]), codec.INVALID),
        (raw(content="nul \u0000 inside"), codec.INVALID),
        (raw(agent="nul\u0000"), codec.INVALID),
        (
            raw(content=[{"type": "tool_use", "id": "t1", "name": "x", "input": {"k": "\u0000"}}]),
            codec.INVALID,
        ),
        (raw(type="purge_sessions.v1", keep=-1, role=..., content=...), codec.INVALID),
        (raw(type="configure.v1", idle_timeout=10**9, role=..., content=...), codec.INVALID),
    ],
)
def test_bad_input_is_rejected_with_a_reason(data: bytes, reason: str) -> None:
    assert reason_of(data) == reason


@pytest.mark.parametrize(
    ("field", "name", "shown"),
    [
        ("agent", "my\u0085bot", "U+0085"),  # NEXT LINE, a C1 control (Cc)
        ("channel", "gen\u2028eral", "U+2028 (LINE SEPARATOR) is a line separator"),
        ("channel", "gen\u2029eral", "U+2029"),  # Zp
        ("agent", "my\u200bbot", "U+200B (ZERO WIDTH SPACE) is a format (invisible)"),
        ("agent", "\u202etobym", "U+202E"),  # RIGHT-TO-LEFT OVERRIDE (Cf)
        ("channel", "a\ufeffb", "U+FEFF"),  # BOM / zero-width no-break space (Cf)
        ("thread", "t\x1b[31m", "U+001B"),  # ESC (Cc)
    ],
)
def test_names_refuse_control_format_and_separator_characters(
    field: str, name: str, shown: str
) -> None:
    with pytest.raises(EventRejected) as info:
        codec.decode(raw(**{field: name}))
    assert info.value.reason == codec.INVALID
    assert shown in info.value.detail and f"$.{field}" in info.value.detail


@pytest.mark.parametrize("name", ["my bot", "caf\u00e9", "no\u00a0break", "\u4e2d\u6587", "Mybot"])
def test_names_keep_other_characters_as_they_are(name: str) -> None:
    event = codec.decode(raw(agent=name, channel=name))
    assert (event.agent, event.channel) == (name, name)


@given(
    st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=20).filter(
        lambda t: any(unicodedata.category(c) in codec.REFUSED_IN_NAMES for c in t)
    )
)
def test_any_name_with_a_refused_character_is_rejected(name: str) -> None:
    assert reason_of(raw(channel=name)) == codec.INVALID


def test_escaped_backslash_before_u0000_is_plain_text() -> None:
    # The text is a backslash followed by "u0000", not a NUL character.
    event = codec.decode(raw(content="\\u0000"))
    assert isinstance(event, ev.MessagePosted)
    assert event.content == "\\u0000"


def test_entry_without_payload_field_is_malformed() -> None:
    with pytest.raises(EventRejected) as info:
        codec.decode_fields({b"x": b"y"})
    assert info.value.reason == codec.MALFORMED
    assert "'x'" in info.value.detail


def test_decoder_survives_interpreter_shutdown() -> None:
    # msgspec issue #717: some constrained unions crash the GC at exit. Guard the
    # shapes we use: building the decoder and exiting must never segfault.
    for _ in range(8):
        done = subprocess.run([sys.executable, "-c", "import schema.codec"], check=False)
        assert done.returncode == 0


_HEAD = (
    b'{"type":"message.v1","event_id":"0192f5a0-0000-7000-8000-000000000001",'
    b'"agent":"a","channel":"c","occurred_at":"2026-01-01T00:00:00Z","role":"user",'
)


@pytest.mark.parametrize(
    ("body", "reason", "needle"),
    [
        (b'"content":"caf\xe9"}', codec.MALFORMED, "UTF-8"),  # Latin-1 from another language
        (b'"content":"\xff\xfe"}', codec.MALFORMED, "UTF-8"),
        (b'"content":"x","extra":' + b"[" * 2000 + b"]" * 2000 + b"}", codec.INVALID, "nests"),
        (
            b'"content":[{"type":"tool_use","id":"t","name":"n","input":{"a":'
            + b"[" * 990
            + b"]" * 990
            + b"}}]}",
            codec.INVALID,
            "nests 994 levels",
        ),
        (b'"content":"x"' + b"}" * 3000, codec.MALFORMED, "UTF-8 JSON"),
    ],
)
def test_any_undecodable_entry_is_rejected_with_a_reason(
    body: bytes, reason: str, needle: str
) -> None:
    """Invalid UTF-8 and deep nesting raised UnicodeDecodeError / RecursionError, which
    stopped ingest for every conversation; they are rejections like any other."""
    with pytest.raises(EventRejected) as caught:
        codec.decode(_HEAD + body)
    assert caught.value.reason == reason
    assert needle in caught.value.detail


@pytest.mark.parametrize(
    "at",
    [
        "9999-12-31T23:59:00Z",
        "0001-01-01T00:00:00+14:00",
        "1969-12-31T23:59:59Z",
        "2100-01-01T00:00:00Z",
    ],
)
def test_times_out_of_range_are_rejected(at: str) -> None:
    data = _HEAD.replace(b"2026-01-01T00:00:00Z", at.encode()) + b'"content":"x"}'
    with pytest.raises(EventRejected, match="occurred_at must be from 1970-01-01"):
        codec.decode(data)


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = "[{" * 5000
    event = codec.decode(_HEAD + b'"content":"' + text.encode() + b'"}')
    assert isinstance(event, ev.MessagePosted) and event.content == text
    assert codec.nesting(b'{"a":[{"b":"]]]}}"}]}') == 3


def test_stored_events_read_back_without_the_newer_rules() -> None:
    """The log keeps what was accepted then: reading it back skips rules added since."""
    old = _HEAD.replace(b"2026-01-01T00:00:00Z", b"2150-01-01T00:00:00Z") + b'"content":"x"}'
    with pytest.raises(EventRejected):
        codec.decode(old)
    assert codec.decode(old, check=False).occurred_at.year == 2150
