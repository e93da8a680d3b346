"""contextlog's RQ worker: it takes over the registration of a dead worker of its own
name, and its scheduler process does not outlive it.

RQ refuses to start a worker whose name is registered and not marked dead, and a
SIGKILLed worker never marks itself: its registration stays until its key expires
(worker_ttl + 60 s, or a job's timeout + 60 s when it died in a job). With stable
names (CONTEXTLOG_CONSUMER) a supervisor's restart then failed for minutes. RQ's
scheduler runs in a forked child that nothing told to stop when its parent was killed.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

import redis
import structlog
from rq import SimpleWorker
from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT, DEFAULT_LOGGING_FORMAT
from rq.job import JobStatus
from rq.scheduler import RQScheduler

from contextlog.schema.errors import ConfigError
from contextlog.worker.tasks.sweeper import heartbeat_key, pid_namespace

log = structlog.get_logger("contextlog.rqworker")

CONSUMER_VAR: Final = "CONTEXTLOG_CONSUMER"


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists on this host (in this pid namespace)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def dead_because(
    registered: Mapping[str, str],
    *,
    host: str,
    pid: int,
    pidns: str,
    alive: Callable[[int], bool] = pid_alive,
) -> str | None:
    """Why the worker described by `registered` (RQ's worker hash, plus `pidns` from
    our heartbeat when known) is provably dead, or None when it may be alive.

    Proof is only possible on this host: a pid means nothing elsewhere, and a stale
    heartbeat does not prove death (a SimpleWorker does not heartbeat during a job, and
    a summary job may last minutes). On this host, in the same pid namespace (two
    containers sharing a hostname have different ones), a pid that does not exist is
    dead, and a pid equal to ours is our own previous life (a container restart hands
    out the same pids); a live pid could be reused by another program, but then we
    cannot tell, and wait for RQ's own expiry instead.
    """
    if registered.get("hostname") != host:
        return None
    theirs = registered.get("pidns", "")
    if theirs and pidns and theirs != pidns:
        return None
    try:
        old = int(registered.get("pid", ""))
    except ValueError:
        return None
    if old == pid:
        return f"pid {old} is this process: it is a restart of the same worker"
    if not alive(old):
        return f"pid {old} no longer exists on this host"
    return None


class WatchfulScheduler(RQScheduler):
    """RQ's scheduler process, which stops (releasing its locks) once its worker is gone.

    RQ forks the scheduler and stops it only from the worker's signal handlers, so a
    SIGKILLed worker left it running, orphaned, holding the scheduler lock. The child
    checks its parent at every heartbeat (each second): once reparented, it stops.
    """

    _parent: int = 0

    def start(self) -> Any:
        """Fork the scheduler process, remembering who its parent is."""
        self._parent = os.getpid()
        return super().start()  # type: ignore[no-untyped-call]

    def heartbeat(self) -> None:
        """RQ's heartbeat, after checking that the worker that forked us still runs."""
        if self._parent and os.getppid() != self._parent:
            self.log.warning("Scheduler: worker %s is gone; stopping", self._parent)
            self.request_stop()  # type: ignore[no-untyped-call]
        super().heartbeat()  # type: ignore[no-untyped-call]


class ContextlogWorker(SimpleWorker):
    """SimpleWorker that takes over a dead namesake's registration and whose scheduler
    process exits with it."""

    # Told of a stop request (SIGTERM, SIGINT) before RQ handles it: `signals.Stopper`,
    # which bounds how long the job in hand may keep the process.
    on_stop: Callable[[], object] | None = None

    def request_stop(self, signum: Any, frame: Any) -> None:
        """RQ's warm shutdown, after telling `on_stop`."""
        if self.on_stop is not None:
            self.on_stop()
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

    def register_birth(self) -> None:
        """RQ's registration, after clearing a provably dead worker of the same name."""
        self._take_over_dead_namesake()
        super().register_birth()  # type: ignore[no-untyped-call]

    def _take_over_dead_namesake(self) -> None:
        registered = _decoded(self.connection.hgetall(self.key))
        if not registered or "death" in registered:
            return  # nobody, or a clean exit: RQ proceeds
        ours = _decoded(self.connection.hgetall(heartbeat_key(self.name)))
        if "pidns" in ours and ours.get("pid") == registered.get("pid"):
            registered["pidns"] = ours["pidns"]
        why = dead_because(
            registered, host=socket.gethostname(), pid=os.getpid(), pidns=pid_namespace()
        )
        if why is None:
            ttl = self.connection.ttl(self.key)
            raise ConfigError(
                f"a worker named {self.name!r} is registered by pid {registered.get('pid')} "
                f"on {registered.get('hostname')} and may be running: stop it, or set "
                f"{CONSUMER_VAR} to another name (if it died, RQ forgets it in {ttl} s)"
            )
        log.warning("taking over a dead worker's registration", worker=self.name, why=why)
        old = SimpleWorker.find_by_key(self.key, connection=self.connection)
        if old is not None:
            old.register_death()  # type: ignore[no-untyped-call]
        if requeued := self._requeue_orphans():
            log.warning("jobs the dead worker had started queued again", count=requeued)

    def _requeue_orphans(self) -> int:
        """Queue again the jobs our dead namesake had started. RQ would call them abandoned
        only once their execution expires (job timeout + a minute), and since a worker of
        that name is alive again, the sweep would not see them as dead either. Jobs are
        idempotent (results carry derived ids), so running one again is safe."""
        requeued = 0
        for queue in self.queues:
            registry = queue.started_job_registry
            for job_id in registry.get_job_ids(cleanup=False):
                job = queue.fetch_job(job_id)
                if job is None or job.worker_name != self.name:
                    continue
                if job.get_status(refresh=True) != JobStatus.STARTED:
                    continue
                registry.remove_executions(job)
                queue.enqueue_job(job)
                requeued += 1
        return requeued

    def _start_scheduler(
        self,
        burst: bool = False,
        logging_level: str | None = "INFO",
        date_format: str = DEFAULT_LOGGING_DATE_FORMAT,
        log_format: str = DEFAULT_LOGGING_FORMAT,
    ) -> None:
        """rq 3.0's `_start_scheduler`, with WatchfulScheduler (RQ has no class hook)."""
        self.scheduler = scheduler = WatchfulScheduler(
            self.queues,
            connection=self.connection,
            logging_level=logging_level if logging_level is not None else self.log.level,
            date_format=date_format,
            log_format=log_format,
            serializer=self.serializer,
        )
        scheduler.acquire_locks()  # type: ignore[no-untyped-call]
        if not scheduler.acquired_locks:
            return
        if not burst:
            scheduler.start()
            return
        try:
            scheduler.register_birth()
            scheduler.enqueue_scheduled_jobs()  # type: ignore[no-untyped-call]
        finally:
            scheduler.release_locks()  # type: ignore[no-untyped-call]
            scheduler.register_death()


def run_until_stopped(
    make: Callable[[], ContextlogWorker],
    stop: threading.Event,
    *,
    backoff_max: float,
    logging_level: str,
    burst: bool = False,
    after: Callable[[], object] = lambda: None,
) -> None:
    """Run RQ's work loop until `stop` is set, again each time it ends on its own.

    RQ's loop ends when Redis refuses a write it needs (a full Redis answers `OOM` to its
    heartbeat), when a command times out outside its wait for jobs, and on anything it
    does not expect; its start fails the same way (registering the worker needs memory).
    The process used to exit then, for good; now it waits (doubling up to `backoff_max`)
    and starts a new worker, which takes over its own registration. `after` runs once
    RQ's loop has returned (it leaves its signal handlers installed).
    """
    delay = 0.0
    while not stop.is_set():
        try:
            make().work(burst=burst, with_scheduler=True, logging_level=logging_level)
        except redis.RedisError as e:
            log.warning("the worker cannot run, retrying", error=str(e))
        else:
            if burst or stop.is_set():
                return
            log.warning("RQ's work loop ended without a stop request, starting it again")
        after()
        delay = min(backoff_max, max(1.0, delay * 2))
        stop.wait(delay)


def _decoded(raw: Any) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (
            v.decode(errors="replace") if isinstance(v, bytes) else str(v)
        )
        for k, v in (raw or {}).items()
    }
