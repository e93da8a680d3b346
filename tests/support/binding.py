"""The Messages API's binding of thinking blocks to their prefix, as a model for tests.

Claude's newest models ("Preserved thinking", "Prefix checks on thinking blocks") check
every `thinking` and `redacted_thinking` block a request sends back: its prefix (the
top-level `system`, the `tools`, every message before it and the blocks before it in its
own message; `cache_control` aside, JSON formatting and key order aside) must be what was
sent when the model produced it, and the thinking blocks kept must be an unbroken run of
the ones produced (removing some from the start or the end is fine, a gap is not). A
block that fails makes it and every later thinking block invalid: a 400, or with
`thinking.block_binding.prefix_mismatch_behavior: "drop_block"` they are dropped.

With compaction ("Compaction and preserved thinking") the prefix starts at the newest
compaction block: a signed one (on-demand) stands for exactly the messages it summarised,
so turns kept after it stay valid when they follow those directly, unchanged, with the
other role; an unsigned one (server-side) starts the prefix afresh.

Signatures here are base64 JSON recording the hash chain at the block, the frame
(system and tools) and the previous thinking block's id. The fake API signs what it
produces with `state_at` and checks what it receives with `check`: the same function, so
the two cannot disagree.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

THINKING: Final = frozenset({"thinking", "redacted_thinking"})
# Models that run the prefix check (the platform docs' list, late 2026).
BINDING_MODELS: Final = (
    "claude-fable-5-1",
    "claude-fable-5-2",
    "claude-mythos-5-1",
    "claude-mythos-5-2",
    "claude-opus-5-5",
    "claude-sonnet-5-5",
    "claude-haiku-5-5",
)
BETA: Final = "thinking-binding-controls-2026-08-01"


def _strip(value: Any) -> Any:
    """`value` without `cache_control` anywhere (the check ignores breakpoints)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def canon(value: Any) -> bytes:
    """The value as the check compares it: its values, not its formatting."""
    return json.dumps(_strip(value), sort_keys=True, separators=(",", ":")).encode()


def _h(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for p in parts:
        digest.update(len(p).to_bytes(8, "big"))
        digest.update(p)
    return digest.hexdigest()


def frame_of(body: dict[str, Any]) -> str:
    """The digest of a request's `system` and `tools` (a string `system` is shorthand
    for one text block, as the API reads it)."""
    system = body.get("system")
    return _h(canon(_blocks(system) if system else []), canon(body.get("tools") or []))


def _blocks(content: Any) -> list[Any]:
    """Content as blocks: a string is shorthand for one text block."""
    return content if isinstance(content, list) else [{"type": "text", "text": content}]


def encode_signature(record: dict[str, Any]) -> str:
    return "Sig" + base64.b64encode(json.dumps(record, sort_keys=True).encode()).decode()


def decode_signature(signature: Any) -> dict[str, Any] | None:
    if not isinstance(signature, str) or not signature.startswith("Sig"):
        return None
    try:
        record = json.loads(base64.b64decode(signature[3:]))
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _signature(block: dict[str, Any]) -> Any:
    return block.get("signature") if block.get("type") == "thinking" else block.get("data")


@dataclass
class _Walk:
    """The hash chain over a request's messages, from its newest compaction block on."""

    frame: str
    state: str
    start: tuple[int, int] = (0, 0)  # the first block the chain covers
    broken: bool = False  # a compaction's kept turns do not follow it as required


def _walk(body: dict[str, Any]) -> _Walk:
    frame = frame_of(body)
    messages = body.get("messages") or []
    walk = _Walk(frame, _h(b"frame", frame.encode()))
    at = _newest_compaction(messages)
    if at is None:
        return walk
    i, j = at
    block = _blocks(messages[i]["content"])[j]
    record = decode_signature(block.get("signature"))
    if record is None:  # server-side: the prefix starts afresh at the block
        walk.state = _h(walk.state.encode(), canon(block))
        walk.start = (i, j + 1)
        return walk
    walk.state = record["chain"]
    walk.start = (i + 1, 0) if j == len(_blocks(messages[i]["content"])) - 1 else (i, j + 1)
    nxt = messages[i + 1] if i + 1 < len(messages) else None
    if (
        walk.start == (i + 1, 0)
        and nxt is not None
        and nxt.get("role")
        in (
            record.get("last_role"),
            "system",
        )
    ):
        walk.broken = True  # merged into the last summarised message by the API
    return walk


def _newest_compaction(messages: list[Any]) -> tuple[int, int] | None:
    found = None
    for i, m in enumerate(messages):
        for j, b in enumerate(_blocks(m.get("content"))):
            if isinstance(b, dict) and b.get("type") == "compaction" and b.get("content"):
                found = (i, j)
    return found


def _chain(body: dict[str, Any]) -> Iterator[tuple[int, int, str]]:
    """Each block the chain covers, (message, block, the chain at that block), and last
    (len(messages), 0, the chain after them all): one pass over the request."""
    walk = _walk(body)
    messages = body["messages"]
    state = walk.state
    si, sj = walk.start
    for i in range(si, len(messages)):
        role = messages[i]["role"].encode()
        blocks = _blocks(messages[i]["content"])
        first = sj if i == si else 0
        for j in range(first, len(blocks)):
            at = _h(state.encode(), role, canon(blocks[first:j]))
            yield i, j, _h(at.encode(), b"broken") if walk.broken else at
        state = _h(state.encode(), role, canon(blocks[first:]))
    yield len(messages), 0, state


def state_at(body: dict[str, Any], i: int, j: int) -> str:
    """The chain at block j of message i of `body` (what a block there is bound to)."""
    return next(s for mi, bj, s in _chain(body) if (mi, bj) == (i, j))


def state_after(body: dict[str, Any]) -> str:
    """The chain after every message of `body` (what a compaction of it records)."""
    *_, (_i, _j, state) = _chain(body)
    return state


@dataclass
class Checked:
    """What the check found: the paths of invalid thinking blocks (first first), and why."""

    invalid: list[str] = field(default_factory=list)
    why: str = ""


def check(body: dict[str, Any]) -> Checked:
    """The thinking blocks of `body` that fail the prefix check."""
    out = Checked()
    frame = frame_of(body)
    previous: str | None = None
    messages = body.get("messages") or []
    for i, j, state in _chain(body):
        if i >= len(messages):
            break
        b = _blocks(messages[i]["content"])[j]
        if not isinstance(b, dict) or b.get("type") not in THINKING:
            continue
        path = f"messages.{i}.content.{j}"
        if out.invalid:
            out.invalid.append(path)
            continue
        record = decode_signature(_signature(b))
        why = _why(record, state, frame, previous)
        if why:
            out.invalid.append(path)
            out.why = why
        elif record is not None:
            previous = record["id"]
    return out


def _why(record: dict[str, Any] | None, state: str, frame: str, previous: str | None) -> str:
    if record is None:
        return "Invalid `signature` in `thinking` block"
    if record["frame"] != frame:
        return "The `system` prompt or the `tools` differ from when this block was created."
    if previous is not None and record["prev"] != previous:
        return (
            "The `thinking` block that preceded this one when it was created is missing"
            " from this request."
        )
    if record["chain"] != state:
        return "Content before this block differs from when it was created."
    return ""


def sign(body: dict[str, Any], content: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    """The assistant `content` a model answers `body` with, its thinking blocks signed
    (bound to the request and the blocks before them)."""
    full = {**body, "messages": [*body["messages"], {"role": "assistant", "content": content}]}
    previous = _last_thinking_id(body)
    out = []
    for j, b in enumerate(content):
        if b.get("type") == "thinking":
            record = {
                "chain": state_at(full, len(full["messages"]) - 1, j),
                "frame": frame_of(body),
                "prev": previous,
                "id": uuid.uuid4().hex,
                "model": model,
            }
            b = {**b, "signature": encode_signature(record)}
            previous = record["id"]
        out.append(b)
    return out


def _last_thinking_id(body: dict[str, Any]) -> str | None:
    last = None
    for m in body.get("messages") or []:
        for b in _blocks(m.get("content")):
            if isinstance(b, dict) and b.get("type") in THINKING:
                record = decode_signature(_signature(b))
                if record is not None:
                    last = record["id"]
    return last


def compaction_block(body: dict[str, Any], summary: str | None) -> dict[str, Any]:
    """The on-demand compaction block for `body`: it stands for all of its messages."""
    messages = body["messages"]
    record = {
        "chain": state_after(body),
        "frame": frame_of(body),
        "last_role": messages[-1]["role"] if messages else None,
        "id": uuid.uuid4().hex,
    }
    return {"type": "compaction", "content": summary, "signature": encode_signature(record)}


def enforced(body: dict[str, Any]) -> bool:
    """Whether the request's model runs the prefix check."""
    return str(body.get("model", "")).startswith(BINDING_MODELS)


def drops(body: dict[str, Any]) -> bool:
    """Whether the request asked for failing blocks to be dropped rather than a 400."""
    thinking = body.get("thinking")
    binding = thinking.get("block_binding") if isinstance(thinking, dict) else None
    return isinstance(binding, dict) and binding.get("prefix_mismatch_behavior") == "drop_block"


def error_message(checked: Checked, beta: bool) -> str:
    """The 400's message, as the API words it."""
    first = checked.invalid[0]
    text = (
        f"{first}: Invalid `signature` in `thinking` block. The block is bound to a different"
        " conversation. Remove the block, or set"
        ' `thinking.block_binding.prefix_mismatch_behavior` to "drop_block".'
    )
    if not beta:
        text += (
            " That setting requires the `thinking-binding-controls-2026-08-01` value in the"
            " `anthropic-beta` header."
        )
    return f"{text} {checked.why}".strip()


def without(body: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """`body` with the thinking blocks at `paths` dropped (what `drop_block` sends on)."""
    drop = {tuple(int(x) for x in p.split(".")[1::2]) for p in paths}
    messages = []
    for i, m in enumerate(body["messages"]):
        content = m["content"]
        if isinstance(content, list):
            content = [b for j, b in enumerate(content) if (i, j) not in drop]
        messages.append({**m, "content": content})
    return {**body, "messages": messages}
