"""The Messages API's checks on `messages`, as its 400 errors describe them.

Used by the property tests and by the mock transport that the real `anthropic`
client talks to, so a context that passes here is one the API would accept.
"""

from __future__ import annotations

from typing import Any

BLOCK_TYPES = {"user": {"text", "tool_result"}, "assistant": {"text", "tool_use"}}


def check_messages(messages: list[dict[str, Any]]) -> list[str]:
    """Every rule the request breaks (empty when valid)."""
    errors: list[str] = []
    tool_ids: set[str] = set()
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        if m.get("role") not in ("user", "assistant"):
            errors.append(f"{where}.role: must be user or assistant")
            continue
        if i == 0 and m["role"] != "user":
            errors.append("messages.0: first message must use the user role")
        if i > 0 and messages[i - 1].get("role") == m["role"]:
            errors.append(f"{where}: roles must alternate between user and assistant")
        content = m.get("content")
        if isinstance(content, str):
            if not content.strip():
                errors.append(f"{where}: text content must be non-empty")
            continue
        if not isinstance(content, list) or not content:
            errors.append(f"{where}.content: must be a non-empty list or string")
            continue
        errors += _check_blocks(where, m["role"], content, tool_ids)
        errors += _check_pairing(i, messages)
    if messages and messages[-1].get("role") == "assistant":
        last = messages[-1]["content"]
        tail = (
            last
            if isinstance(last, str)
            else (last[-1].get("text", "x") if last and last[-1].get("type") == "text" else "x")
        )
        if tail != tail.rstrip():
            errors.append("final assistant content cannot end with trailing whitespace")
    return errors


def _check_blocks(where: str, role: str, content: list[Any], tool_ids: set[str]) -> list[str]:
    errors = []
    seen_other = False
    for j, b in enumerate(content):
        kind = b.get("type")
        if kind not in BLOCK_TYPES[role]:
            errors.append(f"{where}.content.{j}: {kind} is not allowed in a {role} message")
        if kind == "text" and not str(b.get("text", "")).strip():
            errors.append(f"{where}.content.{j}: text content blocks must be non-empty")
        if kind == "tool_use":
            if b.get("id") in tool_ids:
                errors.append(f"{where}.content.{j}: tool_use ids must be unique")
            tool_ids.add(b.get("id", ""))
            if not isinstance(b.get("input"), dict):
                errors.append(f"{where}.content.{j}.input: must be an object")
        if kind == "tool_result" and seen_other:
            errors.append(f"{where}.content.{j}: tool_result blocks must come first")
        seen_other = seen_other or kind != "tool_result"
    return errors


def _check_pairing(i: int, messages: list[dict[str, Any]]) -> list[str]:
    m = messages[i]
    content = m["content"] if isinstance(m["content"], list) else []
    errors = []
    if m["role"] == "assistant":
        uses = [b.get("id") for b in content if b.get("type") == "tool_use"]
        nxt = messages[i + 1] if i + 1 < len(messages) else None
        nxt_content = nxt["content"] if nxt and isinstance(nxt["content"], list) else []
        answered = {b.get("tool_use_id") for b in nxt_content if b.get("type") == "tool_result"}
        errors += [
            f"messages.{i}: tool_use {u} has no tool_result in the next message"
            for u in uses
            if u not in answered
        ]
    else:
        prev = messages[i - 1] if i > 0 else None
        prev_content = prev["content"] if prev and isinstance(prev["content"], list) else []
        asked = {b.get("id") for b in prev_content if b.get("type") == "tool_use"}
        results = [b.get("tool_use_id") for b in content if b.get("type") == "tool_result"]
        errors += [
            f"messages.{i}: tool_result {r} has no tool_use in the previous message"
            for r in results
            if r not in asked
        ]
        if len(results) != len(set(results)):
            errors.append(f"messages.{i}: each tool_use_id may be answered only once")
    return errors
