"""`contextlog status` tells the truth: a stuck ingest, a Postgres refusing writes."""

from __future__ import annotations

from typing import Any

import fakeredis
import psycopg
import pytest

from contextlog.schema import keys
from contextlog.schema.errors import Unavailable
from contextlog.worker.app import bootstrap, status
from contextlog.worker.app.config import Settings
from contextlog.worker.app.status import ShardStatus
from contextlog.worker.cli import common
from contextlog.worker.ingest.streams import Streams


def row(
    owner: str | None, waiting: float | None, committed: float | None, **kw: Any
) -> ShardStatus:
    return ShardStatus(
        shard=2,
        stream_length=10,
        lag=kw.get("lag", 4),
        pending=kw.get("pending", 6),
        oldest_pending_age_s=waiting,
        owner=owner,
        events_stored=0,
        oldest_waiting_age_s=waiting,
        last_commit_age_s=committed,
    )


def test_a_shard_held_with_work_waiting_and_no_commit_is_stuck() -> None:
    stuck = row("ingest-1", waiting=45.0, committed=50.0)
    assert status.stuck_problems([stuck]) == [
        "ingest is stuck on shard 2: ingest-1 holds it and has committed nothing for 50 s "
        "while 10 entries wait (the oldest for 45 s)"
    ]
    never = row("ingest-1", waiting=40.0, committed=None)
    assert "ingest-1 holds it and has never committed" in status.stuck_problems([never])[0]
    assert status.stuck_problems([row("ingest-1", waiting=45.0, committed=2.0)]) == []  # busy
    assert status.stuck_problems([row("ingest-1", waiting=5.0, committed=50.0)]) == []  # quiet
    assert status.stuck_problems([row(None, waiting=45.0, committed=50.0)]) == []  # no owner:
    # another rule says so (shard_problems)


def test_what_ingest_cannot_reach_is_reported_and_a_full_disk_named() -> None:
    r: Any = fakeredis.FakeRedis()
    now_ms = 1_000_000
    for name, error in (
        ("ingest-1", 'Postgres: could not extend file "base/1/2": No space left on device'),
        ("ingest-2", "Postgres: connection refused"),
        ("gone", "Postgres: connection refused"),
    ):
        streams = Streams(r, name)
        streams.record_down("postgres", now_ms - 25_000, error)
        if name != "gone":
            r.zadd(keys.MEMBERS, {name: now_ms + 10_000})  # live
    assert status.outage_problems(r, now_ms) == [
        "Postgres refuses writes: its disk is full (ingest-1, for 25 s): Postgres: could not "
        'extend file "base/1/2": No space left on device',
        "ingest cannot use Postgres (ingest-2, for 25 s): Postgres: connection refused",
    ]


def test_a_connection_refused_for_want_of_disk_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk can refuse the connection itself (a new backend writes its relation
    cache file first): the CLI's one line names the disk, not only the server."""

    def refuse(*_: Any) -> Any:
        def connect() -> Any:
            raise psycopg.OperationalError("FATAL:  could not write init file")

        return connect

    monkeypatch.setattr(bootstrap, "pg_connector", refuse)
    with pytest.raises(Unavailable, match="Postgres refuses connections: its disk is full"):
        common.pg_connect(Settings.from_env({}))
    assert status.disk_full("could not write init file", connecting=True)
    assert not status.disk_full("could not write init file")  # not a running server's write
