"""A private Postgres primary and a streaming replica of it, made with `pg_basebackup`.

The machine's Postgres is never reconfigured: the pair lives in temporary directories on
free loopback ports (as `servers.PostgresCluster`), started once per test session by the
`replica_pair` fixture (registered in tests/conftest.py) and removed at the end.

    pair = ReplicaPair.start_new()
    pair.caught_up()                       # the replica replayed all the primary wrote
    with pair.replay_paused(): ...         # pg_wal_replay_pause(), resumed on exit
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from types import TracebackType

import psycopg
import pytest

from contextlog.worker.store.migrations import migrate
from tests.support import services
from tests.support.servers import PostgresCluster, ServerMissing, postgres_bindir, require_servers
from tests.support.services import with_database

DATABASE = "contextlog_replica"
CATCH_UP_S = 30.0  # seconds the replica may take to replay what the primary wrote
# A primary that streams WAL; its pg_hba (initdb --auth=trust) already trusts replication
# connections from 127.0.0.1.
PRIMARY_SETTINGS = ("wal_level=replica", "max_wal_senders=4", "wal_keep_size=64MB")


class ReplicaPair:
    """A primary and its hot standby; `url`/`replica_url` name the test database on each."""

    def __init__(self, primary: PostgresCluster, replica: PostgresCluster) -> None:
        self.primary = primary
        self.replica = replica
        self.url = with_database(primary.url, DATABASE)
        self.replica_url = with_database(replica.url, DATABASE)

    @classmethod
    def start_new(cls) -> ReplicaPair:
        """Start a primary, clone it with `pg_basebackup -R`, start the clone as a standby,
        and create the migrated test database (replicated like everything else)."""
        primary = PostgresCluster.start_new(PRIMARY_SETTINGS)
        try:
            replica = PostgresCluster.new_dir()
            primary.run(
                "pg_basebackup", "-D", str(replica.datadir), "-h", "127.0.0.1",
                "-p", str(primary.port), "-U", "postgres", "-R", "-X", "stream",
                "--checkpoint=fast", "--no-sync",
            )  # fmt: skip
            pair = cls(primary, replica.start())
        except BaseException:
            primary.close()
            raise
        with psycopg.connect(primary.url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{DATABASE}"')
        with psycopg.connect(pair.url) as conn:
            migrate(conn)
        pair.caught_up()
        return pair

    def __enter__(self) -> ReplicaPair:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def caught_up(self, timeout: float = CATCH_UP_S) -> None:
        """Poll until the replica has replayed everything the primary has written so far."""
        self._reached("pg_last_wal_replay_lsn()", "replayed", timeout)

    def received(self, timeout: float = CATCH_UP_S) -> None:
        """Poll until the replica has received (not necessarily replayed) all the primary's
        WAL so far."""
        self._reached("pg_last_wal_receive_lsn()", "received", timeout)

    def _reached(self, position: str, what: str, timeout: float) -> None:
        with psycopg.connect(self.primary.url, autocommit=True) as conn:
            # The flush position: the replica receives only what the primary has flushed.
            row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        assert row is not None
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.replica.url, autocommit=True) as conn:
            while True:
                done = conn.execute(f"SELECT {position} >= %s::pg_lsn", (row[0],)).fetchone()
                if done is not None and done[0]:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"the replica has not {what} up to {row[0]}")
                time.sleep(0.01)

    def set_replay(self, paused: bool) -> None:
        """Pause or resume WAL replay on the replica (WAL still arrives: it lags)."""
        call = "pg_wal_replay_pause()" if paused else "pg_wal_replay_resume()"
        with psycopg.connect(self.replica.url, autocommit=True) as conn:
            conn.execute(f"SELECT {call}")

    @contextlib.contextmanager
    def replay_paused(self) -> Iterator[None]:
        """Replay paused inside the block, resumed (and caught up) after it."""
        self.set_replay(True)
        try:
            yield
        finally:
            self.set_replay(False)
            self.caught_up()

    def truncate(self) -> None:
        """Empty the test database's tables (on the primary; the replica follows)."""
        services.truncate(self.url)
        self.caught_up()

    def close(self) -> None:
        """Stop both servers and remove their directories."""
        self.replica.close()
        self.primary.close()


def require_replica_binaries() -> None:
    """Skip (fail under CI=true) when initdb, pg_ctl or pg_basebackup are missing."""
    require_servers()
    try:
        if not (postgres_bindir() / "pg_basebackup").exists():
            raise ServerMissing("no pg_basebackup next to pg_ctl (apt-get install postgresql)")
    except ServerMissing as e:
        services.unavailable("a Postgres primary + replica pair", str(e))


@pytest.fixture(scope="session")
def replica_pair() -> Iterator[ReplicaPair]:
    """A primary and a streaming replica for this test session, removed at the end."""
    require_replica_binaries()
    with ReplicaPair.start_new() as pair:
        yield pair


@pytest.fixture
def replicated(replica_pair: ReplicaPair) -> ReplicaPair:
    """The pair, with an empty test database that the replica has caught up with."""
    replica_pair.set_replay(False)  # a failed test may have left it paused
    replica_pair.truncate()
    return replica_pair
