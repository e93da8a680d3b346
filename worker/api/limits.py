"""Per-key request rate limits: a token bucket per key, in this process.

Each `contextlog api` process keeps its own buckets, so N processes behind a balancer let a
key through at up to N times the rate: size `CONTEXTLOG_API_RATE` per process. Pure: the
time comes from the injected monotonic clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

from contextlog.worker.api.problems import ApiError

MAX_KEYS: Final = 100_000  # buckets kept before full ones are forgotten


class RateLimiter:
    """`rate` requests a second per key, in bursts of up to `burst`."""

    def __init__(self, rate: float, burst: int, monotonic: Callable[[], float]) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.monotonic = monotonic
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)

    def wait(self, key: str) -> float:
        """Take a token for `key`: 0 if it had one, else the seconds until it will."""
        now = self.monotonic()
        tokens, at = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens >= 1:
            self._remember(key, (tokens - 1, now))
            return 0.0
        self._remember(key, (tokens, now))
        return (1 - tokens) / self.rate

    def check(self, key: str) -> None:
        """Take a token, or refuse with 429 and when to retry (whole seconds, at least 1)."""
        wait = self.wait(key)
        if wait > 0:
            raise ApiError(
                429,
                "rate-limited",
                f"this key sent more than {self.rate:g} requests a second; retry later",
                retry_after=max(1, math.ceil(wait)),
            )

    def _remember(self, key: str, state: tuple[float, float]) -> None:
        if len(self._buckets) >= MAX_KEYS and key not in self._buckets:
            self._buckets.clear()  # every bucket refills to full: only ever lenient
        self._buckets[key] = state
