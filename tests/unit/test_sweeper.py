"""The worker's background loop on fakeredis and a fake clock: no error ends it silently."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import fakeredis
import pytest
from prometheus_client import REGISTRY

from contextlog.worker.app.clock import FakeClock
from contextlog.worker.tasks.rqworker import dead_because
from contextlog.worker.tasks.sweeper import BEAT_S, Heartbeat, Loop, heartbeat_key


@pytest.fixture
def client() -> Iterator[fakeredis.FakeRedis]:
    c = fakeredis.FakeRedis()
    yield c
    c.close()


def metric(name: str, thread: str) -> float:
    return REGISTRY.get_sample_value(name, {"thread": thread}) or 0.0


class Waits:
    """Stands in for `stop.wait`: advances the fake clock, says stop after `n` waits."""

    def __init__(self, clock: FakeClock, n: int) -> None:
        self.clock, self.left, self.waited = clock, n, list[float]()

    def __call__(self, seconds: float) -> bool:
        self.waited.append(seconds)
        self.clock.advance(seconds)
        self.left -= 1
        return self.left <= 0


def test_every_error_in_a_cycle_is_logged_counted_recorded_and_survived(
    client: fakeredis.FakeRedis,
) -> None:
    clock = FakeClock()
    errors: list[BaseException] = [
        ValueError("Execution 1234 not found in Redis"),  # what ended the thread before
        RuntimeError("a bug"),
    ]
    ran: list[float] = []

    def cycle() -> None:
        ran.append(clock.monotonic())
        if errors:
            raise errors.pop(0)

    before = metric("contextlog_background_errors_total", "t-errors")
    beat = Heartbeat(client, "w1", every=60)
    waits = Waits(clock, n=12)  # 12 waits of 15 s: 180 s, a cycle every 60 s
    Loop("t-errors", cycle, 60, beat, clock, threading.Event(), waits).run()

    assert len(ran) == 3  # at 0, 60 and 120 s: the two failures did not stop it
    assert metric("contextlog_background_errors_total", "t-errors") - before == 2
    assert set(waits.waited) <= {BEAT_S}  # alive beats between sweeps
    assert client.exists(heartbeat_key("w1")) == 0  # a clean stop clears the heartbeat


def test_the_heartbeat_records_failures_and_completed_cycles(
    client: fakeredis.FakeRedis,
) -> None:
    clock = FakeClock()
    beat = Heartbeat(client, "w2", every=60)
    seen: dict[bytes | str, bytes | str] = {}

    def cycle() -> None:
        seen.update(client.hgetall(heartbeat_key("w2")))
        raise ValueError("boom")

    waits = Waits(clock, n=1)
    loop = Loop("t-record", cycle, 60, beat, clock, threading.Event(), waits)
    loop.heartbeat.clear = lambda: None  # type: ignore[method-assign]  # keep it to read
    loop.run()
    fields = client.hgetall(heartbeat_key("w2"))
    at = str(clock.now().timestamp() - BEAT_S).encode()
    assert fields[b"failed_at"] == at and fields[b"error"] == b"ValueError: boom"
    assert b"swept" not in fields and fields[b"every"] == b"60"
    assert seen[b"pid"] and b"pidns" in seen  # identity, for a takeover after SIGKILL


def test_a_thread_that_dies_anyway_says_so(client: fakeredis.FakeRedis) -> None:
    clock = FakeClock()

    def cycle() -> None:
        raise KeyboardInterrupt  # not an Exception: nothing may swallow it

    beat = Heartbeat(client, "w3", every=60)
    loop = Loop("t-dies", cycle, 60, beat, clock, threading.Event(), Waits(clock, 5))
    with pytest.raises(KeyboardInterrupt):
        loop.run()
    fields = client.hgetall(heartbeat_key("w3"))
    assert fields[b"died_error"] == b"KeyboardInterrupt: "
    assert metric("contextlog_background_up", "t-dies") == 0


def test_redis_down_does_not_end_the_loop() -> None:
    server = fakeredis.FakeServer()
    server.connected = False  # every command raises ConnectionError
    down = fakeredis.FakeRedis(server=server)
    clock, ran = FakeClock(), []
    loop = Loop(
        "t-down",
        lambda: ran.append(1),
        60,
        Heartbeat(down, "w4", 60),
        clock,
        threading.Event(),
        Waits(clock, 8),
    )
    loop.run()  # no exception
    assert len(ran) == 2


HOST = "host-a"


@pytest.mark.parametrize(
    ("registered", "dead"),
    [
        ({"hostname": HOST, "pid": "4242"}, True),  # pid gone
        ({"hostname": HOST, "pid": "100"}, True),  # our own pid: a container restart
        ({"hostname": HOST, "pid": "7"}, False),  # alive: maybe it still runs
        ({"hostname": "host-b", "pid": "4242"}, False),  # another host: no proof
        ({"hostname": HOST, "pid": "4242", "pidns": "2"}, False),  # another pid namespace
        ({"hostname": HOST, "pid": "4242", "pidns": "1"}, True),
        ({"hostname": HOST}, False),
    ],
)
def test_a_namesake_is_taken_over_only_when_provably_dead(
    registered: dict[str, str], dead: bool
) -> None:
    why = dead_because(registered, host=HOST, pid=100, pidns="1", alive=lambda p: p == 7)
    assert (why is not None) is dead


def test_jobs_a_dead_namesake_had_started_are_queued_again_at_takeover() -> None:
    """A worker SIGKILLed mid-summary and restarted under the same name: its job stayed
    'started' under a name that is alive again, so neither RQ nor the sweep saw it die,
    and the session's summary never landed."""
    import socket

    from rq import Queue, SimpleWorker
    from rq.job import JobStatus

    from contextlog.worker.tasks.rqworker import ContextlogWorker

    r = fakeredis.FakeRedis()
    q = Queue("summaries", connection=r)
    mine = q.enqueue("builtins.print", "mine", job_id="summarize-mine")
    theirs = q.enqueue("builtins.print", "theirs", job_id="summarize-theirs")
    for name, job in (("w1", mine), ("w2", theirs)):
        q.remove(job)  # dequeued by the worker, then started
        w = SimpleWorker([q], connection=r, name=name)
        w.register_birth()  # type: ignore[no-untyped-call]
        w.prepare_execution(job)
        w.prepare_job_execution(job)
    # w1 was SIGKILLed: its registration names a pid that no longer runs on this host.
    r.hset("rq:worker:w1", mapping={"pid": "999999", "hostname": socket.gethostname()})
    ContextlogWorker([q], connection=r, name="w1").register_birth()
    assert mine.get_status(refresh=True) == JobStatus.QUEUED and q.job_ids == [mine.id]
    assert q.started_job_registry.get_job_ids(cleanup=False) == [theirs.id]  # alive: untouched
