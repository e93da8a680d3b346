"""A process asked to stop exits within its grace, whatever holds it (worker.app.signals)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import ClassVar

from contextlog.worker.app.signals import EXIT_FORCED, Stopper


class FakeTimer:
    """`threading.Timer` that fires only when the test says so."""

    made: ClassVar[list[FakeTimer]] = []

    def __init__(self, seconds: float, fire: Callable[[], None]) -> None:
        self.seconds, self.fire = seconds, fire
        self.started = False
        FakeTimer.made.append(self)

    def start(self) -> None:
        self.started = True

    def cancel(self) -> None:
        pass


def test_the_first_stop_request_sets_stop_and_arms_one_forced_exit() -> None:
    FakeTimer.made.clear()
    exits: list[int] = []
    stopper = Stopper(8.0, exit=exits.append, timer=FakeTimer)
    stopper.request(signal.SIGTERM, None)
    stopper.request(signal.SIGTERM, None)  # a second signal arms nothing more
    assert stopper.stop.is_set()
    [timer] = FakeTimer.made
    assert timer.started and timer.seconds == 8.0 and exits == []
    timer.fire()  # still running when the grace ends
    assert exits == [EXIT_FORCED]


def test_the_forced_exit_timer_does_not_keep_a_stopped_process_alive() -> None:
    stopper = Stopper(3600.0, exit=lambda code: None)
    stopper.request()
    armed = stopper._armed
    assert isinstance(armed, threading.Timer) and armed.daemon
    armed.cancel()


def test_install_handles_sigterm_and_sigint() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    stopper = Stopper(1.0, exit=lambda code: None, timer=FakeTimer)
    try:
        stopper.install()
        assert signal.getsignal(signal.SIGTERM) == stopper.request
        assert signal.getsignal(signal.SIGINT) == stopper.request
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
