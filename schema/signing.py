"""Results only a worker emits, and how ingest knows a worker emitted them.

A summary, a compaction or an idle-timeout save changes what every later context says,
so ingest must not take one from whichever process can write a stream: these events
(`results`) travel with an HMAC-SHA256 of their entry's bytes (`SIGNATURE_FIELD`) under
a key that only workers and ingest hold (CONTEXTLOG_SIGNING_KEY, or one kept in Postgres
where adapters' readers are not granted it). A public producer refuses to build them;
ingest dead-letters one whose signature is missing or wrong as `forged`.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Callable
from typing import Final

from contextlog.schema import events as ev

SIGNATURE_FIELD: Final = b"s"
MIN_KEY_BYTES: Final = 16


def is_result(event: ev.Event) -> bool:
    """Whether only a holder of the signing key may emit `event`: a worker's summary of a
    session, compaction, idle-timeout save or retention expiry, and an operator's erase
    (`ev.OPERATOR_ONLY`)."""
    if isinstance(event, (ev.SummaryGenerated, ev.ContextCompacted, *ev.OPERATOR_ONLY)):
        return True
    return isinstance(event, ev.SessionSaveRequested) and event.auto


def sign(key: bytes, payload: bytes) -> bytes:
    """The signature of an entry's bytes."""
    return hmac.new(key, payload, hashlib.sha256).hexdigest().encode()


class Key:
    """A signing key, loaded once on first use (from Postgres, by `load`: nothing
    connects before it is needed) and kept."""

    def __init__(self, load: Callable[[], bytes]) -> None:
        self._load = load
        self._key: bytes | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, key: bytes) -> Key:
        """A key known up front."""
        return cls(lambda: key)

    def get(self) -> bytes:
        """The key (loaded now if not yet)."""
        with self._lock:
            if self._key is None:
                key = self._load()
                if len(key) < MIN_KEY_BYTES:
                    raise ValueError(f"a signing key must hold at least {MIN_KEY_BYTES} bytes")
                self._key = key
            return self._key

    def sign(self, payload: bytes) -> bytes:
        """`sign` with this key."""
        return sign(self.get(), payload)

    def verify(self, payload: bytes, signature: bytes | None) -> bool:
        """Whether `signature` is this key's for `payload`."""
        return signature is not None and hmac.compare_digest(self.sign(payload), signature)
