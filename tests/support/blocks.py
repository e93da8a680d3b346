"""One example of every content block the Messages API takes, and hypothesis strategies
that draw conversations the way a thinking, tool-using bot produces them."""

from __future__ import annotations

import base64
from typing import Any

from hypothesis import strategies as st

Block = dict[str, Any]

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4).decode()
PDF = base64.b64encode(b"%PDF-1.4\n" + b"0" * 3000).decode()
SIGNATURE = "EqQBCkgIARABGAIiQL+" + "a/b+c=" * 40  # opaque bytes the API checks verbatim

TEXT_PARTS: list[Block] = [
    {"type": "text", "text": "plain"},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
    {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
    {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
        "title": "report",
    },
    {
        "type": "search_result",
        "source": "https://example.com/a",
        "title": "A",
        "content": [{"type": "text", "text": "found it"}],
        "citations": {"enabled": True},
    },
]
RESULT_PARTS: list[Block] = [
    *TEXT_PARTS,
    {"type": "tool_reference", "tool_name": "lookup"},
    {"type": "browser_state", "tabs": [{"url": "https://example.com", "title": "Example"}]},
]

# type -> an example block; the user's and the assistant's side of the API.
PARAMS: dict[str, Block] = {
    "text": {
        "type": "text",
        "text": "The sky is blue.",
        "citations": [
            {
                "type": "char_location",
                "cited_text": "blue",
                "document_index": 0,
                "document_title": "Sky",
                "start_char_index": 0,
                "end_char_index": 4,
            }
        ],
    },
    "image": {
        "type": "image",
        "source": {"type": "file", "file_id": "file_011CNha8iCJcU1wXNR6q4V8w"},
    },
    "document": {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "Grass is green."},
        "title": "Facts",
        "context": "from the wiki",
        "citations": {"enabled": True},
    },
    "search_result": TEXT_PARTS[4],
    "thinking": {
        "type": "thinking",
        "thinking": "Let me think…\n  ünïcode ✓",
        "signature": SIGNATURE,
    },
    "redacted_thinking": {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
    "tool_use": {
        "type": "tool_use",
        "id": "toolu_01A",
        "name": "get_weather",
        "input": {"city": "Oslo"},
    },
    "tool_result": {
        "type": "tool_result",
        "tool_use_id": "toolu_01A",
        "content": RESULT_PARTS,
        "is_error": False,
    },
    "server_tool_use": {
        "type": "server_tool_use",
        "id": "srvtoolu_01",
        "name": "web_search",
        "input": {"query": "weather oslo"},
    },
    "web_search_tool_result": {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_01",
        "content": [
            {
                "type": "web_search_result",
                "url": "https://yr.no",
                "title": "Yr",
                "encrypted_content": "EqgfCioIARgBIiQ3",
                "page_age": "1 day",
            }
        ],
    },
    "web_fetch_tool_result": {
        "type": "web_fetch_tool_result",
        "tool_use_id": "srvtoolu_02",
        "content": {
            "type": "web_fetch_result",
            "url": "https://yr.no",
            "content": {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "4C"},
            },
        },
    },
    "code_execution_tool_result": {
        "type": "code_execution_tool_result",
        "tool_use_id": "srvtoolu_03",
        "content": {
            "type": "code_execution_result",
            "stdout": "4\n",
            "stderr": "",
            "return_code": 0,
            "content": [],
        },
    },
    "bash_code_execution_tool_result": {
        "type": "bash_code_execution_tool_result",
        "tool_use_id": "srvtoolu_04",
        "content": {
            "type": "bash_code_execution_result",
            "stdout": "ok",
            "stderr": "",
            "return_code": 0,
            "content": [],
        },
    },
    "text_editor_code_execution_tool_result": {
        "type": "text_editor_code_execution_tool_result",
        "tool_use_id": "srvtoolu_05",
        "content": {"type": "text_editor_code_execution_create_result", "is_file_update": False},
    },
    "tool_search_tool_result": {
        "type": "tool_search_tool_result",
        "tool_use_id": "srvtoolu_06",
        "content": {"type": "tool_search_tool_search_result", "tool_references": []},
    },
    "container_upload": {"type": "container_upload", "file_id": "file_011CNha8"},
}
SERVER_KINDS = {k for k in PARAMS if k.endswith("_tool_result") and k != "tool_result"}
UNKNOWN: Block = {"type": "hologram", "frames": [{"t": 0, "z": [1, 2]}], "note": "from 2031"}


def server_call(i: str, kind: str = "web_search_tool_result") -> list[Block]:
    """A server tool call and its result, as one response holds them."""
    result = {**PARAMS[kind], "tool_use_id": f"srvtoolu_{i}"}
    call = {**PARAMS["server_tool_use"], "id": f"srvtoolu_{i}"}
    return [call, result]


def thinking(i: str, redacted: bool = False) -> Block:
    if redacted:
        return {"type": "redacted_thinking", "data": f"Em{i}KAhgBEgy3va3pzix"}
    return {"type": "thinking", "thinking": f"step {i}: think", "signature": f"{SIGNATURE}{i}"}


def use(i: str) -> Block:
    return {"type": "tool_use", "id": i, "name": "lookup", "input": {"q": i}}


@st.composite
def user_content(draw: st.DrawFn) -> Any:
    if draw(st.booleans()):
        return draw(st.sampled_from(["hi", "ok ", "done\n", " "]))
    parts = draw(
        st.lists(
            st.sampled_from([*TEXT_PARTS, PARAMS["container_upload"], UNKNOWN]),
            min_size=1,
            max_size=3,
        )
    )
    if draw(st.booleans()):  # an adapter's cache breakpoint: never kept in history
        parts = [*parts[:-1], {**parts[-1], "cache_control": {"type": "ephemeral"}}]
    return parts


@st.composite
def result_for(draw: st.DrawFn, i: str) -> Block:
    content: Any = draw(st.sampled_from(["ok", ""]))
    if draw(st.booleans()):
        content = draw(st.lists(st.sampled_from(RESULT_PARTS), min_size=1, max_size=2))
    return {"type": "tool_result", "tool_use_id": i, "content": content}


@st.composite
def conversation(draw: st.DrawFn, think: bool) -> list[tuple[str, Any]]:
    """(role, content) as posted by a bot calling the API with thinking on (`think`) or
    off: each response of a new turn starts with thinking; after tool results the model
    goes on with or without new thinking (interleaved or not); server tools inside one
    response (or paused: a call without its result); adapters also post stray results,
    blanks and split assistant messages."""
    out: list[tuple[str, Any]] = []
    n = 0
    for _ in range(draw(st.integers(0, 8))):
        out.append(("user", draw(user_content())))
        fresh = True
        for _step in range(draw(st.integers(0, 3))):
            n += 1
            blocks: list[Block] = []
            if think and (fresh or draw(st.booleans())):
                blocks += [
                    thinking(f"{n}_{k}", draw(st.booleans()))
                    for k in range(draw(st.integers(1, 2)))
                ]
            fresh = False
            if draw(st.booleans()):
                call = server_call(str(n), draw(st.sampled_from(sorted(SERVER_KINDS))))
                # A `pause_turn` answer stored as it came: the call without its result.
                blocks += call[:1] if draw(st.integers(0, 5)) == 0 else call
            if draw(st.booleans()):
                blocks.append(
                    {"type": "text", "text": draw(st.sampled_from(["let me see", "done ", "x"]))}
                )
            if draw(st.integers(0, 9)) == 0:
                blocks.append(UNKNOWN)
            ids = [f"t{n}_{k}" for k in range(draw(st.integers(0, 2)))]
            blocks += [use(i) for i in ids]
            if not blocks:
                blocks = [{"type": "text", "text": "ok"}]
            if draw(st.integers(0, 7)) == 0 and len(blocks) > 1:  # posted in two parts
                cut = draw(st.integers(1, len(blocks) - 1))
                out += [("assistant", blocks[:cut]), ("assistant", blocks[cut:])]
            else:
                out.append(("assistant", blocks))
            if not ids:
                break
            answered = draw(st.lists(st.sampled_from(ids), unique=True, min_size=1))
            results: list[Block] = [draw(result_for(i)) for i in answered]
            if draw(st.integers(0, 5)) == 0:
                results.append({"type": "text", "text": "and also"})
            out.append(("user", results))
        if draw(st.integers(0, 9)) == 0:
            out.append(
                ("user", [{"type": "tool_result", "tool_use_id": f"ghost{n}", "content": "?"}])
            )
        if draw(st.integers(0, 9)) == 0:
            out.append((draw(st.sampled_from(["user", "assistant"])), " "))
    return out
