"""Content blocks of a message: what the contract checks of each, and how much each costs.

A message's blocks travel and are stored as the raw JSON the adapter posted (`msgspec.Raw`
in the event), so every block comes back exactly as it was sent: fields this contract
does not model, thinking text and signatures included, byte for byte. Checking is a
second decoding phase (`check`): a block whose `type` is one of the Messages API's
(`KNOWN_TYPES`, the `anthropic` SDK's `ContentBlockParam` and `ContentBlock` unions) is
decoded by its Struct below, which checks the fields the API requires and bounds them;
fields a Struct does not name are left alone (a newer SDK may add some). A block of a type
not known yet must be a JSON object with a short string `type`; it is kept opaque, bounded
only by the entry-size cap and the nesting limit, and counted by its JSON size.

Token counts (`estimate`) are rough, ~4 characters a token, on what the model reads:
text, thinking, tool names and inputs, tool results; an image counts `IMAGE_TOKENS`
(the API's cost of a ~1.15 megapixel image, the size it scales larger ones down to);
a document counts its text, or for a PDF `PDF_BYTES_PER_TOKEN` of its decoded bytes
(at least one image's worth: every PDF page is also read as an image); a PDF stored as
an attachment counts the same by the `size` of its reference, so the estimate does not
change when the bytes are taken out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final, TypeAlias

import msgspec
from msgspec import Meta, Struct

from contextlog.schema import attachments

MAX_TEXT: Final = 200_000
# Inline base64 data: producers take canonical base64 out as attachments (stored apart,
# `schema.attachments`); what stays inline is bound by the entry-size cap first.
MAX_DATA: Final = 1 << 20
MAX_BLOCKS: Final = 256
MAX_NAME: Final = 200
MAX_TYPE: Final = 64

IMAGE_TOKENS: Final = 1600
PDF_BYTES_PER_TOKEN: Final = 20
CHARS_PER_TOKEN: Final = 4

Text = Annotated[str, Meta(max_length=MAX_TEXT)]
Data = Annotated[str, Meta(max_length=MAX_DATA)]
Name = Annotated[str, Meta(min_length=1, max_length=MAX_NAME)]
ToolId = Annotated[str, Meta(min_length=1, max_length=MAX_NAME, pattern=r"^[a-zA-Z0-9_-]+$")]
ToolName = Annotated[str, Meta(min_length=1, max_length=MAX_NAME, pattern=r"^[a-zA-Z0-9_-]+$")]
BlockType = Annotated[str, Meta(min_length=1, max_length=MAX_TYPE)]
RawBlocks = Annotated[list[msgspec.Raw], Meta(max_length=MAX_BLOCKS)]


class _Block(Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of the known blocks: `type` is the tag."""


class Typed(Struct, frozen=True, kw_only=True):
    """A JSON object with a string `type`: a block or part this contract does not model."""

    type: BlockType


class Source(Struct, frozen=True, kw_only=True):
    """An image or document source: base64, url, file, text or content (the API's set may
    grow, so the fields are checked when present rather than by a closed union)."""

    type: BlockType
    media_type: Name | None = None
    data: Data | None = None
    url: Annotated[str, Meta(min_length=1, max_length=8192)] | None = None
    file_id: Name | None = None
    content: Text | RawBlocks | None = None


class CitationsConfig(Struct, frozen=True, kw_only=True):
    enabled: bool = False


class TextBlock(_Block, frozen=True, kw_only=True, omit_defaults=True, tag="text"):
    """A text content block, with the citations of a response when it has them."""

    text: Text
    citations: Annotated[list[Typed], Meta(max_length=MAX_BLOCKS)] | None = None


class ImageBlock(_Block, frozen=True, kw_only=True, tag="image"):
    source: Source


class DocumentBlock(_Block, frozen=True, kw_only=True, tag="document"):
    source: Source
    title: Annotated[str, Meta(max_length=MAX_TEXT)] | None = None
    context: Text | None = None
    citations: CitationsConfig | None = None


class SearchResultBlock(_Block, frozen=True, kw_only=True, tag="search_result"):
    content: Annotated[list[TextBlock], Meta(max_length=MAX_BLOCKS)]
    source: Text
    title: Text
    citations: CitationsConfig | None = None


class ThinkingBlock(_Block, frozen=True, kw_only=True, tag="thinking"):
    """The model's reasoning; sent back verbatim, signature included, or refused."""

    thinking: Text
    signature: Text


class RedactedThinkingBlock(_Block, frozen=True, kw_only=True, tag="redacted_thinking"):
    data: Text


class ToolUseBlock(_Block, frozen=True, kw_only=True, omit_defaults=True, tag="tool_use"):
    """An assistant's request to call a tool."""

    id: ToolId
    name: ToolName
    # Tool input is an arbitrary JSON object chosen by the model: kept as raw JSON,
    # checked to be an object by `check`. The entry-size cap bounds it.
    input: msgspec.Raw


class ServerToolUseBlock(_Block, frozen=True, kw_only=True, tag="server_tool_use"):
    """A call of a server tool (web search, code execution, ...) the API ran itself."""

    id: ToolId
    name: ToolName
    input: msgspec.Raw


class ToolResultBlock(_Block, frozen=True, kw_only=True, omit_defaults=True, tag="tool_result"):
    """The answer to a `tool_use`, sent in the following user turn; list content holds
    text, image, document, search_result, tool_reference, browser_state blocks."""

    tool_use_id: ToolId
    content: Text | RawBlocks = ""
    is_error: bool = False


class _ServerToolResult(_Block, frozen=True, kw_only=True):
    """A server tool's result, in the same assistant turn as its `server_tool_use`. The
    content's shape differs per tool and version: a JSON object or list, not modelled."""

    tool_use_id: ToolId
    content: msgspec.Raw


class WebSearchToolResult(_ServerToolResult, frozen=True, tag="web_search_tool_result"):
    pass


class WebFetchToolResult(_ServerToolResult, frozen=True, tag="web_fetch_tool_result"):
    pass


class CodeExecutionToolResult(_ServerToolResult, frozen=True, tag="code_execution_tool_result"):
    pass


class BashCodeExecutionToolResult(
    _ServerToolResult, frozen=True, tag="bash_code_execution_tool_result"
):
    pass


class TextEditorCodeExecutionToolResult(
    _ServerToolResult, frozen=True, tag="text_editor_code_execution_tool_result"
):
    pass


class ToolSearchToolResult(_ServerToolResult, frozen=True, tag="tool_search_tool_result"):
    pass


class CompactionBlock(_Block, frozen=True, kw_only=True, tag="compaction"):
    """The Messages API's summary of the turns before it (server-side or on-demand
    compaction): kept verbatim, a null `content` included (a compaction that produced no
    summary, which the API treats as a no-op)."""

    content: Text | None = None
    encrypted_content: Text | None = None
    signature: Text | None = None


class ContainerUploadBlock(_Block, frozen=True, kw_only=True, tag="container_upload"):
    file_id: Name


class ToolReferenceBlock(_Block, frozen=True, kw_only=True, tag="tool_reference"):
    tool_name: Name


class BrowserStateBlock(_Block, frozen=True, kw_only=True, tag="browser_state"):
    tabs: Annotated[list[msgspec.Raw], Meta(max_length=MAX_BLOCKS)]


MessageBlock: TypeAlias = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | SearchResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ToolUseBlock
    | ToolResultBlock
    | ServerToolUseBlock
    | WebSearchToolResult
    | WebFetchToolResult
    | CodeExecutionToolResult
    | BashCodeExecutionToolResult
    | TextEditorCodeExecutionToolResult
    | ToolSearchToolResult
    | ContainerUploadBlock
    | CompactionBlock
)
ResultBlock: TypeAlias = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | SearchResultBlock
    | ToolReferenceBlock
    | BrowserStateBlock
)
Block: TypeAlias = MessageBlock | ResultBlock | Typed


def _tags(union: Any) -> frozenset[str]:
    return frozenset(str(c.__struct_config__.tag) for c in union.__args__)


KNOWN_TYPES: Final = _tags(MessageBlock)
KNOWN_RESULT_TYPES: Final = _tags(ResultBlock)
# Results of server tools: in the same assistant turn as their `server_tool_use`.
SERVER_RESULTS: Final = frozenset(
    t for t in KNOWN_TYPES if t.endswith("_tool_result") and t != "tool_result"
)
THINKING: Final = frozenset({"thinking", "redacted_thinking"})
COMPACTION: Final = "compaction"
# What a mid-conversation system message may hold (the API's `SystemMessageParam`, and
# the beta tool addition and removal blocks).
SYSTEM_TYPES: Final = frozenset({"text", "tool_addition", "tool_removal"})

_message_decoder: Final = msgspec.json.Decoder(MessageBlock)
_result_decoder: Final = msgspec.json.Decoder(ResultBlock)
_typed_decoder: Final = msgspec.json.Decoder(Typed)
_UNKNOWN: Final = "- at `$.type`"


class BlockError(ValueError):
    """Raised when a block breaks the contract; the message ends with the JSON path."""


def check(raw: msgspec.Raw, where: str, *, in_result: bool = False) -> Block:
    """The block decoded by its type's Struct (an unknown type as `Typed`), or BlockError
    with the path `where` (e.g. `$.content[2]`) in its message."""
    try:
        return _check(raw, where, in_result)
    except msgspec.ValidationError as e:
        raise BlockError(_relocate(str(e), where)) from e


def _check(raw: msgspec.Raw, where: str, in_result: bool) -> Block:
    decoder = _result_decoder if in_result else _message_decoder
    try:
        block: Block = decoder.decode(raw)
    except msgspec.ValidationError as e:
        message = str(e)
        if not (message.startswith("Invalid value") and message.endswith(_UNKNOWN)):
            raise
        return _typed_decoder.decode(raw)  # a type of a newer API: kept as posted
    if isinstance(block, ToolUseBlock | ServerToolUseBlock):
        if bytes(block.input).lstrip()[:1] != b"{":
            kind = block.__struct_config__.tag
            raise BlockError(f"{kind} input must be a JSON object - at `{where}.input`")
    elif isinstance(block, ToolResultBlock) and not isinstance(block.content, str):
        for i, inner in enumerate(block.content):
            check(inner, f"{where}.content[{i}]", in_result=True)
    elif isinstance(block, DocumentBlock) and isinstance(block.source.content, list):
        for i, inner in enumerate(block.source.content):
            check(inner, f"{where}.source.content[{i}]", in_result=True)
    if (
        isinstance(block, ImageBlock | DocumentBlock)
        and block.source.type == attachments.SOURCE_TYPE
    ):
        # A reference (written by a producer, `schema.attachments`): its fields are
        # checked here, not named in `Source`, where a future API field could clash.
        problem = attachments.check_ref(msgspec.json.decode(raw)["source"])
        if problem:
            raise BlockError(f"{problem} - at `{where}.source`")
    return block


def _relocate(message: str, where: str) -> str:
    """msgspec's path (`$...`) of an error inside a block, as a path inside the event."""
    if "- at `$" in message:
        return message.replace("- at `$", f"- at `{where}", 1)
    return f"{message} - at `{where}`"


def check_all(raws: Sequence[msgspec.Raw], where: str = "$.content") -> list[Block]:
    """Every block of a message checked, in order."""
    return [check(raw, f"{where}[{i}]") for i, raw in enumerate(raws)]


def check_system(content: str | Sequence[msgspec.Raw], where: str = "$.content") -> None:
    """A mid-conversation system message: a string, or text (and tool addition and
    removal) blocks, as the API takes them."""
    if isinstance(content, str):
        return
    for i, raw in enumerate(content):
        block = check(raw, f"{where}[{i}]")
        kind = block.type if isinstance(block, Typed) else block.__struct_config__.tag
        if kind not in SYSTEM_TYPES:
            raise BlockError(
                f"a system message holds text blocks only, not {kind!r} - at `{where}[{i}]`"
            )


class _Tool(Struct, frozen=True, kw_only=True):
    """A tool definition: a client tool (name, input_schema) or a server tool (type,
    name); the rest is the API's to check and is kept as posted."""

    name: Name


_tool_decoder: Final = msgspec.json.Decoder(_Tool)


def check_frame(
    system: str | Sequence[msgspec.Raw] | None, tools: Sequence[msgspec.Raw] | None
) -> None:
    """A bot's request frame: `system` a string or text blocks, each tool an object with a
    name."""
    if system is not None and not isinstance(system, str):
        for i, raw in enumerate(system):
            block = check(raw, f"$.system[{i}]")
            if not isinstance(block, TextBlock):
                raise BlockError(f"system holds text blocks only - at `$.system[{i}]`")
    for i, raw in enumerate(tools or ()):
        try:
            _tool_decoder.decode(raw)
        except msgspec.ValidationError as e:
            raise BlockError(_relocate(str(e), f"$.tools[{i}]")) from e


def estimate(block: Mapping[str, Any]) -> int:
    """The characters a block is worth (`CHARS_PER_TOKEN` a token); see the module doc."""
    kind = block.get("type")
    if kind == "text":
        return _len(block.get("text"))
    if kind == "thinking":
        # The newest models send the reasoning in the signature (encrypted; `thinking`
        # may be empty) and read it back as input: about 3/4 of a base64 character each.
        return max(_len(block.get("thinking")), _len(block.get("signature")) * 3 // 4)
    if kind == "redacted_thinking":
        return _len(block.get("data")) * 3 // 4
    if kind == COMPACTION:
        return _len(block.get("content")) or _len(block.get("encrypted_content")) * 3 // 4
    if kind in ("tool_use", "server_tool_use"):
        return _len(block.get("name")) + len(msgspec.json.encode(block.get("input")))
    if kind == "tool_result":
        return _inner(block.get("content"))
    if kind == "image":
        return IMAGE_TOKENS * CHARS_PER_TOKEN
    if kind == "document":
        return _document(block.get("source"))
    if kind == "search_result":
        return _len(block.get("title")) + _len(block.get("source")) + _inner(block.get("content"))
    return len(msgspec.json.encode(block))  # server tool results, unknown types: their JSON


def _len(value: object) -> int:
    return len(value) if isinstance(value, str) else 0


def _inner(content: object) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(estimate(b) for b in content if isinstance(b, Mapping))
    return 0


def _document(source: object) -> int:
    if not isinstance(source, Mapping):
        return 0
    kind = source.get("type")
    if kind == "text":
        return _len(source.get("data"))
    if kind == "content":
        return _inner(source.get("content"))
    size = attachments.decoded_size(source)  # base64 data, or a stored attachment's size
    if size is not None:
        return max(IMAGE_TOKENS, size // PDF_BYTES_PER_TOKEN) * CHARS_PER_TOKEN
    return IMAGE_TOKENS * CHARS_PER_TOKEN  # a url or file: its size is not known here


def starts_anew(content: Sequence[Any]) -> bool:
    """Whether an assistant message holds a compaction block with a summary: the API
    ignores everything before it (a null one is a no-op)."""
    return any(
        isinstance(b, Mapping)
        and b.get("type") == COMPACTION
        and (b.get("content") is not None or b.get("encrypted_content") is not None)
        for b in content
    )


def decode_raw(raws: Sequence[msgspec.Raw]) -> list[Any]:
    """Raw blocks as plain JSON values (dicts), for counting."""
    return [msgspec.json.decode(raw) for raw in raws]


def text_of(content: object, *, tools: bool = True) -> str:
    """The readable text of a message's content: its text blocks, and with `tools` the
    text of tool results and each tool call's name in brackets (a preview, a session's
    first message); without, only what a person wrote (a summary's quote)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence):
        return ""
    parts: list[str] = []
    for block in content:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif tools and kind == "tool_result":
            parts.append(text_of(block.get("content", "")))
        elif tools and kind == "tool_use":
            parts.append(f"[{block.get('name', 'tool')}]")
    return " ".join(p for p in parts if p)
