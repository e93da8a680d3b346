"""The published contract, generated from the code: the API's OpenAPI document, and the JSON
Schemas of the raw stream entries for adapters that write to Redis themselves.

`python -m contextlog.worker.api.contract` writes them under docs/; a test fails when the
committed files differ from what the code generates.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Final

import msgspec

from contextlog.schema import codec, notices
from contextlog.schema.events import AnyEvent
from contextlog.schema.notices import Notice
from contextlog.worker.api.routes import openapi_document
from contextlog.worker.api.spec import dumps

DRAFT: Final = "https://json-schema.org/draft/2020-12/schema"


def _schema(kind: Any, title: str, description: str) -> dict[str, Any]:
    return {
        "$schema": DRAFT,
        "title": title,
        "description": description,
        **msgspec.json.schema(kind),
    }


def files() -> dict[str, bytes]:
    """Each published file's name under docs/, and its bytes."""
    entries = _schema(
        AnyEvent,
        "contextlog inbound stream entry",
        f"The JSON in the `{codec.ENTRY_FIELD.decode()}` field of an entry XADDed to "
        "`contextlog:in:{shard}` (shard = CRC-32 of `agent` NUL `channel` modulo "
        f"CONTEXTLOG_SHARDS). At most {codec.DEFAULT_MAX_ENTRY_BYTES} bytes; content "
        "blocks are checked by type beyond this schema (invalid entries go to the "
        "dead-letter stream with a reason).",
    )
    notice = _schema(
        Notice,
        "contextlog notification",
        f"The JSON in the `{notices.ENTRY_FIELD}` field of an entry on "
        "`contextlog:out:{source}`; read it through a consumer group, at least once.",
    )
    return {
        "openapi.json": dumps(openapi_document()),
        "stream-entry.schema.json": dumps(entries),
        "notice.schema.json": dumps(notice),
    }


def write(folder: Path) -> list[Path]:
    """Write the files into `folder`; returns their paths."""
    written = []
    for name, data in files().items():
        path = folder / name
        path.write_bytes(data)
        written.append(path)
    return written


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs")
    for p in write(out):
        print(p)
    sys.exit(0)
