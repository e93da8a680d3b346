"""The advisory lock keys of the store, in one place (Postgres advisory locks share one
key space per database)."""

from __future__ import annotations

from typing import Final

# Held exclusively by `contextlog rebuild`, shared by every ingest transaction.
REBUILD_LOCK: Final = 0x72656275  # "rebu"
# One retention step at a time over every worker.
RETENTION_LOCK: Final = 0x6B656570  # "keep"
