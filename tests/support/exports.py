"""Session export files as `contextlog export` writes them, for the import tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HELLO = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]


def export_file(folder: Path, messages: list[dict[str, Any]], **extra: Any) -> Path:
    """`folder`/session.json holding `messages` (and `extra` fields over the defaults)."""
    doc = {
        "format": "contextlog.session.v1",
        "session_id": "2025-01-02_imported",
        "timestamp": "2025-01-02T10:00:00Z",
        "message_count": len(messages),
        "messages": messages,
        **extra,
    }
    path = folder / "session.json"
    path.write_text(json.dumps(doc))
    return path
