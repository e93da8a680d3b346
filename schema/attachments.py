"""Attachments: the bytes of base64 image and document sources, stored once by content hash.

A producer takes every base64 `source.data` out of the image and document blocks of a
message (also inside a tool_result's content and a document's content source), decodes
it once, and sends the bytes beside the stream entry (a Redis key named by the sha256);
the event keeps a reference in its place:

    {"type": "base64", "media_type": "image/png", "data": "iVBO..."}
    {"type": "contextlog.attachment", "media_type": "image/png", "sha256": "9f86...", "size": 52}

Keys keep their positions (`sha256` and `size` where `data` was), so putting the data
back (`restore`) gives the source exactly as posted. Only canonical base64 (RFC 4648,
padded, no line breaks) is taken out, since only then re-encoding the bytes gives the
posted text back; anything else stays inline, bound by the entry-size cap as before.
url and file sources are references already and are left alone.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from contextlog.schema.defaults import env_int
from contextlog.schema.errors import EventRejected, EventTooLarge

SOURCE_TYPE: Final = "contextlog.attachment"
HOLDS_SOURCE: Final = frozenset({"image", "document"})

# The Messages API takes at most 32 MB per request (images, PDFs and text together), so
# an attachment, or a message's attachments together, can never be larger and be sent.
DEFAULT_MAX_BYTES: Final = 32 << 20
# How long the bytes wait in Redis for ingest: generous, to ride out an ingest outage.
DEFAULT_TTL_S: Final = 3 * 86_400
MAX_BYTES_VAR: Final = "CONTEXTLOG_MAX_ATTACHMENT_BYTES"
TTL_VAR: Final = "CONTEXTLOG_ATTACHMENT_TTL"

OVERSIZED: Final = "oversized"
INVALID: Final = "invalid"
MISSING: Final = "attachment_missing"

_HEX: Final = re.compile(r"^[0-9a-f]{64}$")
_BASE64: Final = re.compile(rb"^[A-Za-z0-9+/]*={0,2}$")

Block = dict[str, Any]


@dataclass(frozen=True)
class Limits:
    """The attachment limits a producer enforces, and how long bytes wait in Redis."""

    max_bytes: int = DEFAULT_MAX_BYTES
    ttl_s: int = DEFAULT_TTL_S

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Limits:
        """Read `CONTEXTLOG_MAX_ATTACHMENT_BYTES` and `CONTEXTLOG_ATTACHMENT_TTL` (seconds)."""
        return cls(
            max_bytes=env_int(env, MAX_BYTES_VAR, DEFAULT_MAX_BYTES, 1),
            ttl_s=env_int(env, TTL_VAR, DEFAULT_TTL_S, 60),
        )


@dataclass(frozen=True)
class Blob:
    """The decoded bytes of one attachment and their sha256 (hex)."""

    sha256: str
    data: bytes


def is_ref(source: object) -> bool:
    """Whether a source is an attachment reference."""
    return isinstance(source, Mapping) and source.get("type") == SOURCE_TYPE


def check_ref(source: Mapping[str, Any]) -> str | None:
    """What is wrong with a reference source (None: nothing)."""
    sha, size, media = source.get("sha256"), source.get("size"), source.get("media_type")
    if not isinstance(sha, str) or not _HEX.match(sha):
        return "an attachment reference needs `sha256`, 64 lowercase hex digits"
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        return "an attachment reference needs `size`, a whole number of bytes"
    if not isinstance(media, str) or not media:
        return "an attachment reference needs `media_type`"
    return None


# -- walking the blocks -------------------------------------------------------------------


def _map_sources(content: Any, fn: Callable[[Block, str], Block | None], where: str) -> Any:
    """`content` with each image/document source replaced by `fn(source, path)` when it
    returns a dict; untouched blocks (and lists without a change) are the same objects."""
    if not isinstance(content, list):
        return content
    out: list[Any] = []
    changed = False
    for i, block in enumerate(content):
        new = _map_block(block, fn, f"{where}[{i}]")
        changed |= new is not block
        out.append(new)
    return out if changed else content


def _map_block(block: Any, fn: Callable[[Block, str], Block | None], where: str) -> Any:
    if not isinstance(block, dict):
        return block
    kind = block.get("type")
    if kind == "tool_result":
        inner = _map_sources(block.get("content"), fn, f"{where}.content")
        return block if inner is block.get("content") else {**block, "content": inner}
    if kind not in HOLDS_SOURCE or not isinstance(block.get("source"), dict):
        return block
    source = block["source"]
    if source.get("type") == "content":  # a document made of blocks, images among them
        inner = _map_sources(source.get("content"), fn, f"{where}.source.content")
        if inner is source.get("content"):
            return block
        return {**block, "source": {**source, "content": inner}}
    new = fn(source, f"{where}.source")
    return block if new is None else {**block, "source": new}


def refs(content: Any) -> list[Mapping[str, Any]]:
    """The attachment references in a message's content, in order."""
    found: list[Mapping[str, Any]] = []

    def visit(source: Block, where: str) -> None:
        if is_ref(source):
            found.append(source)

    _map_sources(content, lambda s, w: visit(s, w), "$.content")
    return found


def hashes(content: Any) -> set[str]:
    """The sha256 of every attachment a message's content references."""
    return {str(r["sha256"]) for r in refs(content)}


# -- producer: take the bytes out -----------------------------------------------------------


def extract(content: Any, limits: Limits) -> tuple[Any, list[Blob]]:
    """Content with canonical base64 sources replaced by references, and their bytes.
    Refuses a reference posted by the caller (only this function makes them) and an
    attachment, or the message's attachments together, over `limits.max_bytes`."""
    blobs: dict[str, Blob] = {}
    total = 0

    def take(source: Block, where: str) -> Block | None:
        nonlocal total
        if is_ref(source):
            raise EventRejected(
                INVALID, f"source type {SOURCE_TYPE!r} is reserved - at `{where}.type`"
            )
        if source.get("type") != "base64":
            return None
        raw = _decode(source.get("data"), where, limits)
        if raw is None:
            return None
        total += len(raw)
        if total > limits.max_bytes:
            raise EventTooLarge(
                OVERSIZED,
                f"the attachments of this message are {total} bytes together, over "
                f"{MAX_BYTES_VAR}={limits.max_bytes} (the Messages API takes at most 32 MB "
                f"a request) - at `{where}`",
            )
        sha = hashlib.sha256(raw).hexdigest()
        blobs.setdefault(sha, Blob(sha, raw))
        return reference(source, sha, len(raw))

    return _map_sources(content, take, "$.content"), list(blobs.values())


def _decode(data: object, where: str, limits: Limits) -> bytes | None:
    """The bytes of canonical base64 `data`; None when it must stay inline as posted."""
    if not isinstance(data, str) or not data:
        return None
    size = _b64_size(data)
    if size > limits.max_bytes:  # before decoding: refuse without the work
        raise EventTooLarge(
            OVERSIZED,
            f"attachment is {size} bytes, over {MAX_BYTES_VAR}={limits.max_bytes} "
            f"(the Messages API takes at most 32 MB a request) - at `{where}.data`",
        )
    encoded = data.encode("ascii", "replace")
    if len(data) % 4 or not _BASE64.match(encoded):
        return None
    try:
        raw = binascii.a2b_base64(encoded)
    except binascii.Error:
        return None
    # Canonical iff the last quantum re-encodes to itself (only it can hold spare bits).
    tail = raw[(len(raw) - 1) // 3 * 3 :] if raw else b""
    if base64.b64encode(tail) != encoded[-4:]:
        return None
    return raw


def reference(source: Mapping[str, Any], sha: str, size: int) -> Block:
    """The reference for a base64 source; `sha256` and `size` take the place of `data`."""
    out: Block = {}
    for key, value in source.items():
        if key == "type":
            out[key] = SOURCE_TYPE
        elif key == "data":
            out["sha256"] = sha
            out["size"] = size
        else:
            out[key] = value
    return out


# -- reader: put the bytes back ----------------------------------------------------------


def restore(content: Any, data: Mapping[str, str]) -> Any:
    """Content with each reference replaced by its base64 source (`data`: base64 by
    sha256); a reference whose bytes are not in `data` is left as it is."""

    def put(source: Block, where: str) -> Block | None:
        if not is_ref(source) or source.get("sha256") not in data:
            return None
        out: Block = {}
        for key, value in source.items():
            if key == "type":
                out[key] = "base64"
            elif key == "sha256":
                out["data"] = data[value]
            elif key != "size":
                out[key] = value
        return out

    return _map_sources(content, put, "$.content")


def decoded_size(source: Mapping[str, Any]) -> int | None:
    """The bytes a base64 source or a reference stands for (None: not known here)."""
    if source.get("type") == SOURCE_TYPE:
        size = source.get("size")
        return size if isinstance(size, int) else None
    data = source.get("data")
    if source.get("type") == "base64" and isinstance(data, str):
        return _b64_size(data)
    return None


def _b64_size(data: str) -> int:
    """How many bytes padded base64 `data` decodes to, without decoding it."""
    return len(data) * 3 // 4 - data.endswith("=") - data.endswith("==")
