"""How a long-running process (ingest, worker) stops, within a bound whatever its servers do.

The first SIGTERM or SIGINT asks it to finish what it has in hand and exit (ingest: the
batch in hand, then it gives its leases back; the worker: the job in hand). A process
still running `CONTEXTLOG_STOP_GRACE` seconds later, held by a server that stopped
answering or a job that does not end, exits at once with EXIT_FORCED: what it held and
had not acknowledged is delivered again (ingest's entries, absorbed by event id) or
queued again (a job, whose results carry derived ids), so nothing is lost or doubled.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Final, Protocol

import structlog

log = structlog.get_logger("contextlog.signals")

EXIT_FORCED: Final = 3  # the CLI's "a server could not be reached" code


class Timer(Protocol):
    """What `threading.Timer` gives: started once, cancelled if the process exits first."""

    def start(self) -> None: ...

    def cancel(self) -> None: ...


class Stopper:
    """Turns the first stop signal into `stop.set()` and a forced exit after `grace`."""

    def __init__(
        self,
        grace: float,
        stop: threading.Event | None = None,
        *,
        exit: Callable[[int], object] = os._exit,
        timer: Callable[[float, Callable[[], None]], Timer] = threading.Timer,
    ) -> None:
        self.grace = grace
        self.stop = stop or threading.Event()
        self._exit = exit  # os._exit: no cleanup may block it (a hung socket, a lock)
        self._timer = timer
        self._armed: Timer | None = None

    def install(self) -> None:
        """Handle SIGTERM and SIGINT with `request` (in the main thread)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.request)

    def request(self, *_: object) -> None:
        """Ask the process to stop; the first call arms the forced exit. Nothing here
        logs: a signal handler runs between two steps of the main thread, which may hold
        the log's lock, and would wait for itself."""
        if self._armed is None:
            timer = self._timer(self.grace, self._force)
            if isinstance(timer, threading.Thread):
                timer.daemon = True  # it must not keep a process that stopped in time alive
            timer.start()
            self._armed = timer
        self.stop.set()

    def _force(self) -> None:
        log.error(
            "did not stop within the grace after the stop signal; exiting now (what it "
            "held is delivered again)",
            grace_s=self.grace,
        )
        self._exit(EXIT_FORCED)
