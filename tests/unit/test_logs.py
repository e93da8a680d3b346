"""Logs as people and collectors see them: the console form on a terminal, JSON lines
elsewhere, one timestamp a line, no colours into files, and no routine library chatter."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest
import structlog

from contextlog.worker.app import logs

ISO = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Stderr:
    """What was written to stderr (pytest's capture: a file, not a terminal)."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys, self.text = capsys, ""

    def getvalue(self) -> str:
        self.text += self.capsys.readouterr().err
        return self.text


@pytest.fixture(autouse=True)
def fresh_rq_logger() -> None:
    """rq.worker as a new process has it: an RQ worker run earlier in this process (a test's
    `work(logging_level=...)`) leaves its level, handlers and propagation behind."""
    rq = logging.getLogger("rq.worker")
    rq.setLevel(logging.NOTSET)
    rq.propagate = True
    for h in list(rq.handlers):
        rq.removeHandler(h)


@pytest.fixture
def stderr(capsys: pytest.CaptureFixture[str]) -> Stderr:
    return Stderr(capsys)


def lines_of(out: io.StringIO | Stderr) -> list[str]:
    return out.getvalue().splitlines()


def test_auto_writes_json_lines_when_stderr_is_not_a_terminal(stderr: Stderr) -> None:
    logs.configure("info", "auto")
    structlog.get_logger().info("stored", shard=1)
    logging.getLogger("rq.worker").info("Worker %s: started", "w1")
    ours, theirs = (json.loads(line) for line in lines_of(stderr))
    assert (ours["event"], ours["shard"], ours["level"]) == ("stored", 1, "info")
    assert theirs["event"] == "Worker w1: started" and "timestamp" in theirs


def test_auto_writes_the_console_form_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    tty = Terminal()
    monkeypatch.setattr("sys.stderr", tty)  # in the test: pytest resets it after set-up
    logs.configure("info", "auto")
    structlog.get_logger().info("stored", shard=1)
    (line,) = lines_of(tty)
    assert not line.startswith("{") and "stored" in line and "\x1b[" in line  # coloured


def test_console_form_into_a_file_has_no_colours(stderr: Stderr) -> None:
    logs.configure("info", "console")
    structlog.get_logger().warning("fenced", shard=2)
    logging.getLogger("psycopg.pool").warning("pool slow")
    assert len(lines_of(stderr)) == 2
    assert "\x1b" not in stderr.getvalue()
    assert all(len(ISO.findall(line)) == 1 for line in lines_of(stderr))  # one timestamp


def test_console_form_without_timestamps_for_a_supervisor_that_stamps(
    stderr: Stderr,
) -> None:
    logs.configure("info", "console", timestamps=False)
    structlog.get_logger().info("stored", shard=1)
    logging.getLogger("rq.worker").info("Worker %s: started", "w1")
    assert len(lines_of(stderr)) == 2 and not ISO.search(stderr.getvalue())
    logs.configure("info", "json", timestamps=False)  # JSON lines always carry theirs
    structlog.get_logger().info("stored")
    assert "timestamp" in json.loads(lines_of(stderr)[-1])


@pytest.mark.parametrize("level", ["info", "debug"])
def test_rq_maintenance_lines_are_debug(stderr: Stderr, level: str) -> None:
    logs.configure(level, "json")
    rq = logging.getLogger("rq.worker")
    rq.info("Worker %s: cleaning registries for queue: %s", "w1", "idle")
    rq.info("Worker %s: cleaning group registries", "w1")
    rq.info("Worker %s: started", "w1")
    found = [json.loads(line) for line in lines_of(stderr)]
    routine = [f for f in found if "cleaning" in f["event"]]
    assert [f["event"] for f in found if "cleaning" not in f["event"]] == ["Worker w1: started"]
    if level == "info":
        assert routine == []
    else:
        assert [f["level"] for f in routine] == ["debug", "debug"]
