"""Event ids: UUIDv7 (time-ordered) or, for a platform message, derived from its id."""

from __future__ import annotations

import os
import time
import uuid
from typing import Final

# Fixed namespace: the derived id of (source, external_id) must be the same forever.
NAMESPACE: Final = uuid.UUID("6f0f7c1e-3c57-4b8e-9d0a-6a3f4f1c2b7d")


def uuid7(unix_ms: int | None = None) -> uuid.UUID:
    """A version-7 UUID: 48 bits of Unix milliseconds, then 74 random bits (RFC 9562)."""
    ms = time.time_ns() // 1_000_000 if unix_ms is None else unix_ms
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a
    value |= 0b10 << 62  # variant
    value |= rand & 0x3FFF_FFFF_FFFF_FFFF  # rand_b
    return uuid.UUID(int=value)


def derived_id(source: str | None, external_id: str) -> uuid.UUID:
    """The id of a platform message: re-sending it after a crash yields the same event."""
    return uuid.uuid5(NAMESPACE, f"{source or ''}\x00{external_id}")
