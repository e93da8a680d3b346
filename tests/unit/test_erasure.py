"""The erase contract (schema/erasure.py): what a redacted event keeps and loses, and the
requests an erase is sent as. Property tests hold redaction to the product's own rules:
the context of any history with any of its messages erased is valid for the API (the
oracle of tests/support/anthropic_rules.py), and nothing of what was said is left."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextlog.producers.context import Segment, build_context, clean_start
from contextlog.schema import codec, erasure
from contextlog.schema import events as ev
from contextlog.schema.errors import EventRejected
from tests.support import properties
from tests.support.anthropic_rules import check_messages
from tests.support.blocks import conversation
from tests.unit.test_context import stored

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SECRET = "plutonium-7"


def _leaves(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [
            s
            for k, v in value.items()
            if k not in ("type", "id", "tool_use_id", "name")
            for s in _leaves(v)
        ]
    if isinstance(value, list):
        return [s for v in value for s in _leaves(v)]
    return []


@settings(max_examples=properties.examples(300))
@given(think=st.booleans(), data=st.data())
def test_any_history_with_any_messages_erased_is_valid_for_the_api(
    think: bool, data: st.DataObject
) -> None:
    """An erase is a boundary that removes the thinking of every kept turn (strip through
    the last seq); redacted messages keep their roles, tool ids and blankness, so the
    context stays valid, and no text of theirs is left."""
    convo = data.draw(conversation(think))
    erased = data.draw(st.sets(st.integers(0, len(convo) - 1))) if convo else set()
    redacted = [
        (role, erasure.redact_content(content) if i in erased else content)
        for i, (role, content) in enumerate(convo)
    ]
    log = stored(redacted)
    ctx = build_context(log, Segment(strip_through=len(log), boundary="erase", boundaries=1))
    assert check_messages(ctx.messages) == []
    for i in erased:
        role, content = redacted[i]
        assert all(s in ("", erasure.ERASED_TEXT) or not s.strip() for s in _leaves(content))
        assert clean_start(role, content) == clean_start(role, convo[i][1])


def test_what_a_redacted_message_keeps() -> None:
    content = [
        {"type": "thinking", "thinking": SECRET, "signature": "sig"},
        {"type": "text", "text": f"it is {SECRET}", "citations": [{"cited_text": SECRET}]},
        {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": SECRET}},
        {"type": "image", "source": {"type": "contextlog.attachment", "sha256": "ab" * 32}},
        {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {"q": SECRET}},
        {"type": "web_search_tool_result", "tool_use_id": "srv_1", "content": [SECRET]},
        {"type": "text", "text": "  "},
    ]
    assert erasure.redact_content(content) == [
        {"type": "text", "text": "[erased]"},
        {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}},
        {"type": "text", "text": "[erased]"},
        {"type": "text", "text": "  "},
    ]
    result = [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_1",
            "is_error": True,
            "content": [{"type": "text", "text": SECRET}],
        }
    ]
    assert erasure.redact_content(result) == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True, "content": "[erased]"}
    ]
    assert erasure.redact_content(" ") == " " and erasure.redact_content(SECRET) == "[erased]"


@pytest.mark.parametrize(
    ("cls", "fields"),
    [
        (
            ev.MessagePosted,
            {"role": "user", "content": SECRET, "sender": "ann", "external_id": "m1"},
        ),
        (ev.SessionSaveRequested, {"description": SECRET, "sender": "ann"}),
        (ev.SearchRequested, {"query": SECRET, "sender": "ann"}),
        (ev.SummaryGenerated, {"session_id": "s1", "summary": f"ann said {SECRET}"}),
        (ev.ContextCompacted, {"through_seq": 3, "summary": SECRET}),
    ],
    ids=lambda x: ev.TAGS[x] if isinstance(x, type) else "",
)
def test_a_redacted_payload_holds_nothing_said_and_still_decodes(
    cls: type[ev.Event], fields: dict[str, Any]
) -> None:
    common: dict[str, Any] = {
        "event_id": uuid.UUID(int=1),
        "agent": "a",
        "channel": "c",
        "occurred_at": T0,
    }
    event = cls(**common, **fields)
    payload = json.loads(codec.encode(event))
    erase_id = str(uuid.UUID(int=2))
    out = erasure.redact_payload(payload, erase_id)
    text = json.dumps(out)
    assert SECRET not in text and "ann" not in text.replace("channel", "")
    assert out["erased"] == {"erase_id": erase_id}
    assert erasure.redact_payload(out, str(uuid.UUID(int=3))) == out  # idempotent
    back = codec.decode(json.dumps(out).encode(), check=False)
    assert back.erased is not None and back.event_id == event.event_id
    if "summary" in payload:
        assert len(out["summary"]) == len(payload["summary"])  # same length: same counts


@given(st.text(max_size=300))
def test_filler_has_the_length_of_what_it_replaces(text: str) -> None:
    out = erasure.filler(text)
    assert len(out) == len(text) and (not text or out.startswith("[erased]"[: len(text)]))


def test_a_request_names_its_subject_by_hash_on_the_right_shards() -> None:
    sender = erasure.request("bot", shards=4, now=T0, sender="ann", source="cli")
    assert [e.shard for e in sender] == [0, 1, 2, 3]
    assert {e.subject for e in sender} == {erasure.subject_hash("bot", "sender", "ann")}
    assert all(erasure.shard_of("bot", e.channel, 4) == e.shard for e in sender)
    assert len({e.erase_id for e in sender}) == 1 and len({e.event_id for e in sender}) == 4
    again = erasure.request("bot", shards=4, now=T0, sender="ann", erase_id=sender[0].erase_id)
    assert [e.event_id for e in again] == [e.event_id for e in sender]  # sent twice: once
    [session] = erasure.request("bot", shards=4, now=T0, channel="dm-ann", session_id="s1")
    assert session.scope == "session" and session.shard == erasure.shard_of("bot", "dm-ann", 4)
    assert session.session == erasure.subject_hash("bot", "session", "s1")
    for e in [*sender, session]:
        assert codec.decode(codec.encode(e)) == e
        assert "ann" not in codec.encode(e).decode().replace("channel", "")
    with pytest.raises(ValueError, match="give no channel"):
        erasure.request("bot", shards=4, now=T0, sender="ann", channel="c")
    with pytest.raises(ValueError, match="give a channel"):
        erasure.request("bot", shards=4, now=T0)


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"scope": "sender", "shard": 4, "shards": 4}, "shard 4 of 4"),
        ({"scope": "session", "shard": 0, "shards": 4}, "names the session"),
        ({"scope": "sender", "shard": 0, "shards": 4, "session": "ab" * 32}, "names the session"),
    ],
)
def test_an_erase_that_could_not_be_applied_is_refused(fields: dict[str, Any], why: str) -> None:
    e = ev.EraseRequested(
        event_id=uuid.UUID(int=1),
        agent="a",
        channel="contextlog:erase:0",
        occurred_at=T0,
        erase_id=uuid.UUID(int=2),
        subject="cd" * 32,
        **fields,
    )
    with pytest.raises(EventRejected, match=why):
        codec.decode(codec.encode(e))
