"""Time, injected: real code reads a `Clock`; tests pass a `FakeClock` and `advance()` it."""

from __future__ import annotations

import datetime as dt
import time
from typing import Protocol

from contextlog.producers.commands import utcnow


class Clock(Protocol):
    """Wall time for decisions, monotonic time for intervals, and sleeping."""

    def now(self) -> dt.datetime:
        """The current UTC time."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait `seconds` (a fake clock advances instead)."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> dt.datetime:
        """The current UTC time (the producers' wall clock, `utcnow`)."""
        return utcnow()

    def monotonic(self) -> float:
        """`time.monotonic()`."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """`time.sleep()`."""
        time.sleep(seconds)


class FakeClock:
    """A clock that moves only when told to; `sleep` advances it instantly."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self._now = start or dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        self._mono = 1000.0
        self.slept: list[float] = []

    def now(self) -> dt.datetime:
        """The fake current time."""
        return self._now

    def monotonic(self) -> float:
        """Fake monotonic seconds."""
        return self._mono

    def sleep(self, seconds: float) -> None:
        """Record the sleep and advance by it."""
        self.slept.append(seconds)
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self._now += dt.timedelta(seconds=seconds)
        self._mono += seconds
