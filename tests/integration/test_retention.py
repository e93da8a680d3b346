"""`contextlog retire`: whole silent conversations leave the log, archived first, never
one a live session references; an archive restores the very rows (issue 14.3)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import psycopg
import pytest

from contextlog.schema import events as ev
from contextlog.schema.errors import Refused
from contextlog.worker.cli import main as cli
from contextlog.worker.store import retention
from contextlog.worker.store.eventlog import PostgresEventLog
from contextlog.worker.store.rebuild import rebuild
from tests.integration.test_partition import T0, command, entry, fill, message
from tests.integration.test_rebuild import snapshot

LATER = T0 + dt.timedelta(days=100)


def log_rows(url: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT * FROM events ORDER BY position").fetchall()


def fill_with_purged(url: str) -> None:
    """`fill`, plus a conversation whose only session was purged (deleted)."""
    fill(url)
    log = PostgresEventLog(psycopg.connect(url))
    log.append(0, 1, [entry(message("purged", i)) for i in range(4)])
    log.append(0, 1, [entry(command(ev.SessionSaveRequested, "purged", 5))])
    log.append(0, 1, [entry(command(ev.SessionsPurgeRequested, "purged", 6, keep=0))])
    log.close()


def test_retire_archives_then_drops_only_unreferenced_conversations(
    db: str, tmp_path: Path
) -> None:
    fill_with_purged(db)
    before, projections = log_rows(db), snapshot(db)
    with psycopg.connect(db) as conn:
        done = retention.retire(conn, tmp_path, now=LATER, idle_for=dt.timedelta(days=30))
    assert done.conversations == [("alpha", "dm-7"), ("alpha", "purged")]
    assert done.referenced == [("alpha", "general"), ("alpha", "random")]  # live sessions
    archived = [json.loads(line) for line in done.archive.read_text().splitlines()]
    gone = [r for r in before if r[3] in ("dm-7", "purged")]
    assert done.events == len(archived) == len(gone) == 19
    assert [a["event_id"] for a in archived] == [str(r[1]) for r in gone]
    assert log_rows(db) == [r for r in before if r[3] not in ("dm-7", "purged")]
    live = snapshot(db)
    assert all(row[1] in ("general", "random") for part in live for row in part)
    with psycopg.connect(db) as conn:  # invariant 3: still what a replay gives
        rebuild(conn)
    assert snapshot(db) == live
    with psycopg.connect(db) as conn:
        assert retention.restore(conn, done.archive) == 19
        rebuild(conn)
        with pytest.raises(Refused, match="already holds events of alpha/dm-7"):
            retention.restore(conn, done.archive)
    assert log_rows(db) == before
    assert snapshot(db) == projections


def test_retire_leaves_recent_conversations(db: str, tmp_path: Path) -> None:
    fill(db)
    with psycopg.connect(db) as conn:
        soon = T0 + dt.timedelta(days=1)
        done = retention.retire(conn, tmp_path, now=soon, idle_for=dt.timedelta(days=30))
    assert done.conversations == [] and done.events == 0
    assert not done.archive.exists()
    with psycopg.connect(db) as conn:
        with pytest.raises(Refused, match="idle period must be positive"):
            retention.retire(conn, tmp_path, now=LATER, idle_for=dt.timedelta(0))
        with pytest.raises(Refused, match="does not exist"):
            retention.retire(conn, tmp_path / "nope", now=LATER, idle_for=dt.timedelta(days=1))


def test_a_conversation_that_woke_up_is_not_retired(db: str, tmp_path: Path) -> None:
    """The candidates are re-checked under the conversation's row lock: one that took a
    message since (here: a cut-off before its last activity) is left alone."""
    fill(db)
    with psycopg.connect(db) as conn, (tmp_path / "a.jsonl").open("w") as out:
        assert retention._retire_one(conn, out, "alpha", "dm-7", T0) is None
    assert (tmp_path / "a.jsonl").read_text() == ""


def test_cli_retire_usage_and_restore_errors(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", db)
    assert cli.main(["retire", "--idle-for", "30d"]) == cli.EXIT_ERROR
    assert "give --idle-for and --archive" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"agent": "a"}\n')
    assert cli.main(["retire", "--restore", str(bad)]) == cli.EXIT_ERROR
    assert "line 1 is not an archived event" in capsys.readouterr().err
    assert cli.main(["retire", "--idle-for", "1s", "--archive", str(tmp_path)]) == 0
    assert "retired 0 conversations" in capsys.readouterr().out
