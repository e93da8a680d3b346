"""Every content block of the installed `anthropic` SDK is accepted and comes back as posted."""

from __future__ import annotations

import base64
import typing
from typing import Any

import anthropic.types as sdk
import anthropic.types.tool_result_block_param as tool_result_param
import msgspec
import pytest
from anthropic.types.beta import BetaCompactionBlockParam, BetaTextBlockParam

from contextlog.producers.commands import Encoder
from contextlog.producers.context import StoredMessage, build_context, estimate_tokens
from contextlog.schema import attachments, blocks, codec
from contextlog.schema import events as ev
from contextlog.schema.errors import EventRejected
from contextlog.worker.store.rows import tokens_of
from tests.support.anthropic_rules import check_messages
from tests.support.blocks import PARAMS, SIGNATURE, UNKNOWN, server_call
from tests.unit.test_events import COMMON


def _tags(union: Any) -> set[str]:
    """The `type` literals of a union of SDK block types (TypedDicts or models)."""
    while typing.get_origin(union) is typing.Annotated:
        union = typing.get_args(union)[0]
    out = set()
    for member in typing.get_args(union):
        fields = getattr(member, "model_fields", None)  # a response model, or a TypedDict
        kind = fields["type"].annotation if fields else typing.get_type_hints(member)["type"]
        while typing.get_origin(kind) is not typing.Literal:
            kind = typing.get_args(kind)[0]
        out |= set(typing.get_args(kind))
    return out


def test_the_contract_knows_every_block_type_of_the_installed_sdk() -> None:
    """A new SDK release that adds a block type fails here, naming it; the beta
    `compaction` block is known too (a compaction block starts a context)."""
    api = _tags(sdk.ContentBlockParam) | _tags(sdk.ContentBlock)
    assert api - blocks.KNOWN_TYPES == set()
    assert blocks.KNOWN_TYPES - api == {"compaction"}
    assert _tags(BetaCompactionBlockParam | BetaTextBlockParam) - api == {"compaction"}
    assert _tags(tool_result_param.Content) - blocks.KNOWN_RESULT_TYPES == set()
    assert set(PARAMS) | {"compaction"} == blocks.KNOWN_TYPES  # examples below


def _posted(role: str, content: list[dict[str, Any]]) -> ev.MessagePosted:
    event = ev.MessagePosted(role=role, content=content, **COMMON)  # type: ignore[arg-type]
    prepared = Encoder(1).prepare(event)  # what a producer checks and sends
    decoded = codec.decode(prepared.payload)
    assert isinstance(decoded, ev.MessagePosted)
    return decoded


@pytest.mark.parametrize("kind", sorted(PARAMS))
def test_every_block_type_is_accepted_and_kept_byte_for_byte(kind: str) -> None:
    role = "user" if kind in ("image", "document", "search_result", "tool_result") else "assistant"
    content = server_call("01", kind) if kind in ("server_tool_use",) else [PARAMS[kind]]
    event = _posted(role, content)
    assert isinstance(event.content, list)
    back = [msgspec.json.decode(raw) for raw in event.content]
    # Base64 sources travel as attachment references; the reader puts the bytes back.
    blobs = Encoder(1).prepare(ev.MessagePosted(role=role, content=content, **COMMON)).blobs  # type: ignore[arg-type]
    data = {key.rsplit(":", 1)[1]: base64.b64encode(raw).decode() for key, raw in blobs}
    assert attachments.restore(back, data) == content
    assert tokens_of(event) == estimate_tokens(content) >= 1


def test_response_blocks_dumped_by_the_sdk_are_accepted_as_they_are() -> None:
    message = sdk.Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude",
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 1, "output_tokens": 1},
            "content": [
                PARAMS["thinking"],
                PARAMS["redacted_thinking"],
                *server_call("9"),
                {**PARAMS["text"], "citations": None},
                PARAMS["tool_use"],
            ],
        }
    )
    dumped = [b.model_dump(exclude_none=True) for b in message.content]
    event = _posted("assistant", dumped)
    assert [msgspec.json.decode(r) for r in event.content] == dumped
    assert (
        dumped[0]["signature"] == SIGNATURE
        and dumped[0]["thinking"] == PARAMS["thinking"]["thinking"]
    )


def test_a_block_type_not_known_yet_is_kept_opaque() -> None:
    event = _posted("user", [UNKNOWN])
    assert [msgspec.json.decode(r) for r in event.content] == [UNKNOWN]
    assert tokens_of(event) == len(msgspec.json.encode(UNKNOWN)) // 4
    ctx = build_context([StoredMessage(1, "user", [UNKNOWN], 5)])
    assert ctx.messages == [{"role": "user", "content": [UNKNOWN]}]


@pytest.mark.parametrize(
    ("block", "needle"),
    [
        ({"frames": []}, "missing required field `type`"),
        ({"type": ""}, "$.content[0].type"),
        ({"type": 7}, "$.content[0].type"),
        ("just a string", "Expected `object`"),
        ({"type": "thinking", "thinking": "x"}, "signature"),
        ({"type": "image", "source": {"type": "base64", "data": 5}}, "$.content[0].source.data"),
        ({"type": "server_tool_use", "id": "s1", "name": "web_search", "input": []}, "object"),
        (
            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]},
            "`source` - at `$.content[0].content[0]`",
        ),
        ({"type": "tool_result", "tool_use_id": "t", "content": [{"text": "x"}]}, "`type`"),
    ],
)
def test_bad_blocks_are_refused_with_their_path(block: Any, needle: str) -> None:
    with pytest.raises(EventRejected) as info:
        _posted("user", [block])
    assert info.value.reason == codec.INVALID
    assert needle in info.value.detail


def test_images_and_documents_count_a_rough_fixed_cost_not_their_base64() -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "A" * 200_000},
    }
    assert estimate_tokens([image]) == blocks.IMAGE_TOKENS
    pdf = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": "A" * 200_000},
    }
    assert estimate_tokens([pdf]) == max(blocks.IMAGE_TOKENS, 150_000 // blocks.PDF_BYTES_PER_TOKEN)
    assert estimate_tokens([PARAMS["thinking"]]) >= 1


def test_every_block_round_trips_through_context_assembly() -> None:
    user = [PARAMS[k] for k in ("text", "image", "document", "search_result", "container_upload")]
    reply = [PARAMS["thinking"], PARAMS["redacted_thinking"], *server_call("1"), PARAMS["tool_use"]]
    for kind in sorted(blocks.KNOWN_TYPES):
        if kind.endswith("_tool_result") and kind != "tool_result":
            reply = [*reply[:-1], *server_call(kind, kind), reply[-1]]
    log = [
        StoredMessage(1, "user", user, 10),
        StoredMessage(2, "assistant", reply, 10),
        StoredMessage(3, "user", [PARAMS["tool_result"]], 10),
    ]
    ctx = build_context(log)
    assert [m["content"] for m in ctx.messages] == [user, reply, [PARAMS["tool_result"]]]
    assert check_messages(ctx.messages, thinking=True) == []
