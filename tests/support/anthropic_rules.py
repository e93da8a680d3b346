"""The Messages API's checks on `messages`, as its 400 errors describe them.

Used by the property tests and by the mock transport that the real `anthropic`
client talks to, so a context that passes here is one the API would accept.

Thinking rules (docs: "Extended thinking", "Context windows", the API's 400 messages):
- thinking and redacted_thinking blocks appear in assistant messages only, and an
  assistant message that holds any must start with one ("If an assistant message
  contains any thinking blocks, the first block must be thinking or redacted_thinking");
- with thinking enabled, the current tool-use cycle (the messages after the last user
  message that answers no tool call) must start its first assistant message with a
  thinking block when the request ends inside it ("a final assistant message must start
  with a thinking block (preceding the lastmost set of tool_use and tool_result blocks)");
- with thinking disabled, a final assistant message cannot contain thinking;
- thinking of earlier, finished turns is accepted and ignored (stripped by the API).
Server tools run inside one assistant message: each `server_tool_use` has its result
(same id) later in that message, and each such result follows its call. At most four
blocks carry `cache_control` in the whole request (tools, system and messages; see
`check_params`), never a thinking or redacted_thinking block ("Thinking blocks cannot be
marked with cache_control directly"). `system` is a string or a list of non-empty text
blocks. Block types a newer API added pass unchecked.

Mid-conversation system messages (docs: "Mid-conversation system messages"): on the
models that take them, a `role: "system"` message holds a string or text (tool addition,
tool removal) blocks; it must immediately follow a user turn (or an assistant turn ending
in a server tool result), and be the last message or be followed by an assistant turn;
never `messages[0]`; consecutive ones are judged as one. Older models refuse the role.

Compaction (docs: "Compaction", "Compaction on demand"): a `compaction` block with a
summary goes first: the first block of the first message (user or assistant), at most
one per request; the request may then start with that assistant message.

The prefix check on thinking blocks is `tests.support.binding`.
"""

from __future__ import annotations

from typing import Any

from contextlog.schema.blocks import KNOWN_RESULT_TYPES, KNOWN_TYPES

THINKING = {"thinking", "redacted_thinking"}
SERVER_RESULTS = {t for t in KNOWN_TYPES if t.endswith("_tool_result") and t != "tool_result"}
BLOCK_TYPES = {
    "user": {
        "text",
        "image",
        "document",
        "search_result",
        "tool_result",
        "container_upload",
        "compaction",
    },
    "assistant": {"text", "tool_use", "server_tool_use", "container_upload", "compaction"}
    | THINKING
    | SERVER_RESULTS,
}
SYSTEM_BLOCK_TYPES = {"text", "tool_addition", "tool_removal"}
MAX_CACHE_BREAKPOINTS = 4
# Models that take mid-conversation system messages (the platform docs' list).
SYSTEM_MESSAGE_MODELS = (
    "claude-fable-5",
    "claude-mythos-5",
    "claude-opus-4-8",
    "claude-opus-5",
    "claude-sonnet-5-5",
    "claude-haiku-5-5",
)


def takes_system_messages(model: str) -> bool:
    """Whether `model` accepts `role: "system"` in `messages`."""
    return model.startswith(SYSTEM_MESSAGE_MODELS)


def check_messages(
    messages: list[dict[str, Any]],
    *,
    thinking: bool | None = None,
    system_messages: bool = True,
) -> list[str]:
    """Every rule the request breaks (empty when valid); `thinking`: whether the request
    enables extended thinking (None: check only the rules that hold either way);
    `system_messages`: whether the model takes mid-conversation system messages."""
    errors: list[str] = []
    tool_ids: set[str] = set()
    errors += _check_compaction(messages)
    previous: dict[str, Any] | None = None  # the last user or assistant message
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        if m.get("role") == "system":
            if not system_messages:
                errors.append(f"{where}.role: Input should be 'user' or 'assistant'")
            else:
                errors += _check_system(i, messages)
            continue
        if m.get("role") not in ("user", "assistant"):
            errors.append(f"{where}.role: must be user or assistant")
            continue
        if previous is None and m["role"] != "user" and not _compaction_first(m):
            errors.append(f"{where}: first message must use the user role")
        if (
            previous is not None
            and previous.get("role") == m["role"]
            and not _compaction_only(previous)
        ):
            errors.append(f"{where}: roles must alternate between user and assistant")
        previous = m
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
    errors += _check_final(messages, thinking)
    errors += _check_cache(messages)
    return errors


def _compaction_first(m: dict[str, Any]) -> bool:
    content = _list(m.get("content"))
    return bool(content) and _kind(content[0]) == "compaction"


def _compaction_only(m: dict[str, Any]) -> bool:
    content = _list(m.get("content"))
    return bool(content) and all(_kind(b) == "compaction" for b in content)


def _check_compaction(messages: list[dict[str, Any]]) -> list[str]:
    """A compaction block with a summary is the first block of the first message; one."""
    found = [
        (i, j)
        for i, m in enumerate(messages)
        for j, b in enumerate(_list(m.get("content")))
        if _kind(b) == "compaction" and isinstance(b, dict) and b.get("content") is not None
    ]
    errors = []
    if len(found) > 1:
        errors.append("compaction_block_ambiguous: messages holds more than one compaction block")
    errors += [
        f"messages.{i}.content.{j}: compaction_block_misplaced: the compaction block is not"
        " the first block of the conversation"
        for i, j in found
        if (i, j) != (0, 0) or messages[0].get("role") == "system"
    ]
    return errors


def _check_system(i: int, messages: list[dict[str, Any]]) -> list[str]:
    """A mid-conversation system message: its content and its place."""
    where = f"messages.{i}"
    errors = []
    content = messages[i].get("content")
    if isinstance(content, str):
        if not content.strip():
            errors.append(f"{where}: text content must be non-empty")
    elif not isinstance(content, list) or not content:
        errors.append(f"{where}.content: must be a non-empty list or string")
    else:
        for j, b in enumerate(content):
            if _kind(b) not in SYSTEM_BLOCK_TYPES:
                errors.append(f"{where}.content.{j}: {_kind(b)} is not allowed in a system message")
            elif _kind(b) == "text" and not str(b.get("text", "")).strip():
                errors.append(f"{where}.content.{j}: text content blocks must be non-empty")
    # Consecutive system messages are judged as one section.
    first = i
    while first > 0 and messages[first - 1].get("role") == "system":
        first -= 1
    last = i
    while last + 1 < len(messages) and messages[last + 1].get("role") == "system":
        last += 1
    if first == 0:
        errors.append(f"{where}: a system message cannot be the first message")
    elif not _may_precede_system(messages[first - 1]):
        errors.append(f"{where}: a system message must immediately follow a user turn")
    if last + 1 < len(messages) and messages[last + 1].get("role") != "assistant":
        errors.append(
            f"{where}: a system message must be the last message or be followed by an"
            " assistant turn"
        )
    return errors


def _may_precede_system(m: dict[str, Any]) -> bool:
    if m.get("role") == "user":
        return True
    content = _list(m.get("content"))
    return m.get("role") == "assistant" and bool(content) and _kind(content[-1]) in SERVER_RESULTS


def _check_final(messages: list[dict[str, Any]], thinking: bool | None) -> list[str]:
    errors = []
    messages = [m for m in messages if m.get("role") != "system"]
    if messages and messages[-1].get("role") == "assistant":
        last = messages[-1]["content"]
        tail = (
            last
            if isinstance(last, str)
            else (last[-1].get("text", "x") if last and last[-1].get("type") == "text" else "x")
        )
        if tail != tail.rstrip():
            errors.append("final assistant content cannot end with trailing whitespace")
        if thinking is False and any(_kind(b) in THINKING for b in _list(last)):
            errors.append(
                f"messages.{len(messages) - 1}: When thinking is disabled, an assistant"
                " message in the final position cannot contain thinking"
            )
    if thinking:
        errors += _check_cycle(messages)
    return errors


def _check_cycle(messages: list[dict[str, Any]]) -> list[str]:
    """With thinking on, a request ending inside a tool-use cycle starts it with thinking."""
    messages = [m for m in messages if m.get("role") != "system"]
    clean = [i for i, m in enumerate(messages) if m.get("role") == "user" and _clean(m)]
    start = clean[-1] + 1 if clean else 0
    first = next(
        (i for i in range(start, len(messages)) if messages[i]["role"] == "assistant"), None
    )
    if first is None:
        return []
    blocks = _list(messages[first]["content"])
    if blocks and _kind(blocks[0]) in THINKING:
        return []
    return [
        f"messages.{first}.content.0.type: Expected thinking or redacted_thinking. When"
        " thinking is enabled, a final assistant message must start with a thinking block"
        " (preceding the lastmost set of tool_use and tool_result blocks)"
    ]


def _clean(m: dict[str, Any]) -> bool:
    return not any(_kind(b) == "tool_result" for b in _list(m.get("content")))


def _list(content: Any) -> list[Any]:
    return content if isinstance(content, list) else []


def _kind(block: Any) -> Any:
    return block.get("type") if isinstance(block, dict) else None


def check_request_messages(body: dict[str, Any]) -> list[str]:
    """`check_messages` with what the request says: its model (system messages) and
    whether thinking is on."""
    thinking = body.get("thinking")
    on = isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
    return check_messages(
        body.get("messages") or [],
        thinking=on,
        system_messages=takes_system_messages(str(body.get("model", ""))),
    )


def check_params(body: dict[str, Any]) -> list[str]:
    """What the API refuses in a request's `tools` and `system`, and in its breakpoints
    counted over tools, system and messages together (`check_messages` checks the rest)."""
    errors = []
    tools = body.get("tools", [])
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools
    ):
        errors.append("tools: must be a list of tools, each with a name")
        tools = []
    system = body.get("system")
    blocks = _list(system)
    if system is not None and not isinstance(system, str | list):
        errors.append("system: must be a string or a list of text blocks")
    for j, b in enumerate(blocks):
        if _kind(b) != "text" or not str(b.get("text", "")).strip():
            errors.append(f"system.{j}: must be a non-empty text block")
    count = sum("cache_control" in t for t in tools) + sum(
        "cache_control" in b for b in blocks if isinstance(b, dict)
    )
    count += _count_cache(body.get("messages") or [])
    if count > MAX_CACHE_BREAKPOINTS:
        errors.append(_TOO_MANY)
    return errors


_TOO_MANY = f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided"


def _count_cache(messages: list[dict[str, Any]]) -> int:
    count = 0
    for m in messages:
        for b in _list(m.get("content")):
            count += "cache_control" in b
            count += sum(
                "cache_control" in x for x in _list(b.get("content")) if isinstance(x, dict)
            )
    return count


def _check_cache(messages: list[dict[str, Any]]) -> list[str]:
    errors = [
        f"messages.{i}.content.{j}: Thinking blocks cannot be marked with cache_control"
        for i, m in enumerate(messages)
        for j, b in enumerate(_list(m.get("content")))
        if _kind(b) in THINKING and "cache_control" in b
    ]
    if _count_cache(messages) > MAX_CACHE_BREAKPOINTS:
        errors.append(_TOO_MANY)
    return errors


def _check_blocks(where: str, role: str, content: list[Any], tool_ids: set[str]) -> list[str]:
    errors = []
    seen_other = False
    lead = content[1:] if content and _kind(content[0]) == "compaction" else content
    if any(_kind(b) in THINKING for b in lead) and _kind(lead[0]) not in THINKING:
        errors.append(
            f"{where}.content.0: If an assistant message contains any thinking blocks, the"
            " first block must be thinking or redacted_thinking"
        )
    for j, b in enumerate(content):
        kind = b.get("type")
        known = kind in KNOWN_TYPES
        if known and kind not in BLOCK_TYPES[role]:
            errors.append(f"{where}.content.{j}: {kind} is not allowed in a {role} message")
        if kind == "text" and not str(b.get("text", "")).strip():
            errors.append(f"{where}.content.{j}: text content blocks must be non-empty")
        if kind in ("tool_use", "server_tool_use"):
            if b.get("id") in tool_ids:
                errors.append(f"{where}.content.{j}: tool_use ids must be unique")
            tool_ids.add(b.get("id", ""))
            if not isinstance(b.get("input"), dict):
                errors.append(f"{where}.content.{j}.input: must be an object")
        if kind == "thinking" and not isinstance(b.get("signature"), str):
            errors.append(f"{where}.content.{j}.signature: Field required")
        if kind == "tool_result":
            errors += [
                f"{where}.content.{j}.content.{k}: {_kind(x)} is not allowed in a tool_result"
                for k, x in enumerate(_list(b.get("content")))
                if _kind(x) in KNOWN_TYPES and _kind(x) not in KNOWN_RESULT_TYPES
            ]
        if kind == "tool_result" and seen_other:
            errors.append(f"{where}.content.{j}: tool_result blocks must come first")
        seen_other = seen_other or kind != "tool_result"
    if role == "assistant":
        errors += _check_server_tools(where, content)
    return errors


def _check_server_tools(where: str, content: list[Any]) -> list[str]:
    errors = []
    calls: set[str] = set()
    answered: set[str] = set()
    for j, b in enumerate(content):
        if _kind(b) == "server_tool_use":
            calls.add(b.get("id"))
        elif _kind(b) in SERVER_RESULTS:
            if b.get("tool_use_id") not in calls:
                errors.append(f"{where}.content.{j}: server tool result without its call")
            answered.add(b.get("tool_use_id"))
    errors += [
        f"{where}: server_tool_use {c} has no result in the same message"
        for c in sorted(calls - answered)
    ]
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
