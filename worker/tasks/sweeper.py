"""The worker's background loop: a cycle that no error can end silently, and a heartbeat
in Redis that `contextlog status` reads to tell a live worker from a dead one.

The heartbeat is one hash per worker, `contextlog:worker:{<worker name>}:sweep` (braces:
one Redis Cluster slot), with these fields, all Unix seconds except the last ones:
`beat` (the thread was alive, every BEAT_S), `swept` (the last completed cycle),
`every` (the worker's CONTEXTLOG_SWEEP_SECONDS), `failed_at` and `error` (the last cycle
that raised), `died` and `died_error` (the thread ended on an exception), `pid` and
`pidns` (who wrote it).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import redis
import structlog
from redis.typing import EncodableT, FieldT

from contextlog.schema import keys
from contextlog.worker.app import metrics
from contextlog.worker.app.clock import Clock

log = structlog.get_logger("contextlog.sweeper")

BEAT_S: Final = 15.0  # how often a live thread says so, however long its interval
KEY_TTL_S: Final = 7 * 86400  # a dead worker's last word stays readable this long
ERROR_CHARS: Final = 300


def pid_namespace() -> str:
    """This process's pid namespace ('' where there is no /proc)."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def heartbeat_key(worker_name: str) -> str:
    """The hash where the worker named `worker_name` records its sweeper's heartbeat."""
    return keys.worker_heartbeat(worker_name)


class Heartbeat:
    """Records a background thread's liveness, its completed cycles and its failures."""

    def __init__(self, client: redis.Redis, worker_name: str, every: float) -> None:
        self._client = client
        self.key = heartbeat_key(worker_name)
        self.every = every

    def beat(self, at: float, *, swept: bool = False) -> None:
        """The thread is alive at `at`; `swept`: it also completed a cycle."""
        fields: dict[FieldT, EncodableT] = {"beat": at, "every": self.every}
        if swept:
            fields["swept"] = at
        self._write(fields)

    def failed(self, at: float, error: BaseException) -> None:
        """A cycle raised `error` at `at`; the thread goes on."""
        self._write({"beat": at, "every": self.every, "failed_at": at, "error": _text(error)})

    def died(self, at: float, error: BaseException) -> None:
        """The thread ended on `error`."""
        self._write({"died": at, "died_error": _text(error)})

    def started(self, at: float) -> None:
        """A new thread starts: forget a previous one's death and failures."""
        with self._client.pipeline() as pipe:
            pipe.hdel(self.key, "died", "died_error", "failed_at", "error")
            # pid and pid namespace: what a restart of the same name needs to prove that
            # this process is dead (worker.rqworker.dead_because).
            fields: dict[FieldT, EncodableT] = {"beat": at, "every": self.every, "started": at}
            fields.update(pid=os.getpid(), pidns=pid_namespace())
            pipe.hset(self.key, mapping=fields)
            pipe.expire(self.key, int(KEY_TTL_S))
            pipe.execute()

    def clear(self) -> None:
        """The worker stops cleanly: nothing to report."""
        self._client.delete(self.key)

    def _write(self, fields: dict[FieldT, EncodableT]) -> None:
        with self._client.pipeline() as pipe:
            pipe.hset(self.key, mapping=fields)
            pipe.expire(self.key, int(KEY_TTL_S))
            pipe.execute()


def _text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:ERROR_CHARS]


@dataclass
class Loop:
    """Runs `cycle` at once and then every `every` seconds until `stop` is set.

    Any exception in a cycle is logged with its traceback, counted
    (`contextlog_background_errors`) and recorded in the heartbeat; the loop goes on.
    If the thread ends anyway (an error outside a cycle, KeyboardInterrupt, a bug here),
    that is logged at critical level, the `contextlog_background_up` gauge drops to 0 and
    the heartbeat says `died`, which `contextlog status` reports.
    """

    name: str
    cycle: Callable[[], object]
    every: float
    heartbeat: Heartbeat
    clock: Clock
    stop: threading.Event
    wait: Callable[[float], bool] | None = None  # tests pass one that advances a FakeClock

    def run(self) -> None:
        """The thread's target."""
        up = metrics.BACKGROUND_UP.labels(self.name)
        try:
            self._record(self.heartbeat.started)
            up.set(1)
            self._loop()
        except BaseException as e:
            log.critical("background thread died", thread=self.name, exc_info=True)
            up.set(0)
            self._record(self.heartbeat.died, e)
            raise
        up.set(0)
        try:  # a clean stop: nothing for status to report
            self.heartbeat.clear()
        except redis.RedisError as e:
            log.warning("sweeper heartbeat not cleared", thread=self.name, error=str(e))

    def _loop(self) -> None:
        wait = self.wait or self.stop.wait
        due = self.clock.monotonic()
        while True:
            if self.clock.monotonic() >= due:
                due = self.clock.monotonic() + self.every
                self._once()
            else:
                self._record(self.heartbeat.beat)
            if wait(max(0.0, min(BEAT_S, due - self.clock.monotonic()))):
                return

    def _once(self) -> None:
        try:
            self.cycle()
        # Why every Exception: this thread is the worker's only repair of lost summaries
        # and timers; a bug or an unexpected library error in one cycle (rq's "Execution
        # ... not found" ended it before) must cost that cycle, not the rest of the process.
        except Exception as e:
            log.error(
                "background cycle failed; the next runs as planned", thread=self.name, exc_info=True
            )
            metrics.BACKGROUND_ERRORS.labels(self.name).inc()
            self._record(self.heartbeat.failed, e)
            return
        self._record(self.heartbeat.beat, swept=True)

    def _record(self, write: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        """A heartbeat write, stamped now; Redis being down must not end the thread either."""
        try:
            write(self._at(), *args, **kwargs)
        except redis.RedisError as e:
            log.warning("sweeper heartbeat not recorded", thread=self.name, error=str(e))

    def _at(self) -> float:
        return self.clock.now().timestamp()
