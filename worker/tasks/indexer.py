"""The search indexer of `contextlog worker`: turns the messages ingest queued
(`search_pending`, migration 016) into search rows, right after they are stored.

A thread with a connection of its own that LISTENs to ingest's commit signal
(`contextlog_commits`, sent by every batch): each commit wakes it, it indexes what is
queued in steps of a few thousand messages (a transaction each, shared with other
workers' indexers), and when the queue is empty it waits for the next commit (at most
`WAIT_S`, so a signal missed during an outage costs a second). Errors are logged and
retried after a pause; none ends the thread. The lag is in `contextlog status`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

import psycopg
import structlog
from psycopg.rows import TupleRow

from contextlog.schema.queries import query
from contextlog.worker.app import metrics
from contextlog.worker.store import search

log = structlog.get_logger("contextlog.indexer")

WAIT_S: Final = 1.0  # the longest wait for a commit's signal
RETRY_S: Final = 2.0  # the pause after a failed step


class Indexer:
    """The indexer's loop (`run` is the thread's target)."""

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[TupleRow]],
        stop: threading.Event,
        wait_s: float = WAIT_S,
    ) -> None:
        self.connect = connect
        self.stop = stop
        self.wait_s = wait_s
        self.indexed = 0
        self._conn: psycopg.Connection[TupleRow] | None = None

    def run(self) -> None:
        """Index until `stop` is set."""
        while not self.stop.is_set():
            try:
                self.step()
            # Why every Exception: the indexer must outlive a bad moment (an outage, a
            # bug in one step); what it did not index stays queued for the next step.
            except Exception:
                log.error("search indexing failed; retrying", exc_info=True)
                metrics.BACKGROUND_ERRORS.labels("indexer").inc()
                self._close()
                self.stop.wait(RETRY_S)
        self._close()

    def step(self) -> int:
        """Index what is queued, then wait for a commit when nothing was."""
        conn = self._connection()
        done = search.index_pending(conn)
        if done:
            self.indexed += done
            metrics.SEARCH_INDEXED.inc(done)
            return done
        for _ in conn.notifies(timeout=self.wait_s, stop_after=1):
            pass
        return 0

    def _connection(self) -> psycopg.Connection[TupleRow]:
        if self._conn is None or self._conn.closed:
            conn = self.connect()
            conn.autocommit = True
            conn.execute(query("listen_commits"))
            self._conn = conn
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
