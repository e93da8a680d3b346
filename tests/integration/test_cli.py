"""The `contextlog` CLI as a user meets it: exit codes (0 done, 2 bad input, 3 a server
unreachable), one line on stderr and never a traceback, user data printed literally,
and export/import of sessions between conversations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from contextlog.producers import ContextReader, Producer
from contextlog.producers.notifications import Notifications
from contextlog.schema import keys
from contextlog.schema import notices as nt
from contextlog.schema.notices import Notice
from contextlog.worker.app import logs
from contextlog.worker.cli import main as cli
from contextlog.worker.cli.common import console
from contextlog.worker.store import archive
from tests.support import services
from tests.support.exports import HELLO, export_file
from tests.support.running import eventually, running, settings_for

pytestmark = pytest.mark.integration

A, C = "alpha", "general"
CONTEXTLOG = str(Path(sys.executable).parent / "contextlog")


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`contextlog ARGV` in this process: exit code, stdout, stderr."""
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(err: str, *fragments: str) -> None:
    """A message a person can act on: one line, no traceback, naming what went wrong."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], err


@pytest.fixture
def env(db: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment the CLI reads: the test database and Redis, quiet logs."""
    values = {
        "DATABASE_URL": db,
        "REDIS_URL": redis_url,
        "CONTEXTLOG_SHARDS": "4",
        "CONTEXTLOG_LOG_LEVEL": "warning",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


# Servers unreachable, silent, hanging up or refusing: tests/integration/test_cli_outages.py


# --- bad input: exit 2 with a message ----------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["sessions", A, "--page", "-1"], "--page"),
        (["sessions", A, "--page", "x"], "--page"),
        (["dead-letters", "--limit", "0"], "--limit"),
        (["send", "purge-sessions", A, C, "--keep", "-3"], "--keep"),
        (["send", "message", A, C, "[" * 100_000, "--blocks"], "JSON"),
        (["send", "message", A, C, "{not json", "--blocks"], "JSON"),
        (["send", "message", A, C, '{"type": "text"}', "--blocks"], "invalid"),
        (["export", "2025-01-02_x", "--agent", A], "--channel"),
        (["nosuchcommand"], "invalid choice"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_bad_input_exits_2_with_one_line(
    argv: list[str], fragment: str, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(argv, capsys)
    assert code == 2, err
    assert_one_line(err, fragment)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("REDIS_URL", "redis://127.0.0.1:6379/99x"),
        ("REDIS_URL", "redis://127.0.0.1:port/1"),
        ("CONTEXTLOG_SHARDS", "many"),
    ],
)
def test_bad_configuration_exits_2_naming_the_variable(
    name: str,
    value: str,
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(name, value)
    code, _, err = run(["status"], capsys)
    assert code == 2, err
    assert_one_line(err, name)


@pytest.mark.parametrize("argv", [["status"], ["dead-letters"], ["send", "message", A, C, "hi"]])
def test_a_shard_count_other_than_ingests_is_refused(
    argv: list[str],
    env: dict[str, str],
    rds: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The streams this would read or write are not the ones ingest reads."""
    rds.set(keys.SHARDS_KEY, 8)  # as an ingest with CONTEXTLOG_SHARDS=8 recorded it
    code, _, err = run(argv, capsys)
    assert code == 2
    assert_one_line(err, "CONTEXTLOG_SHARDS is 4 here but ingest runs with 8")


def test_send_save_takes_the_description_as_an_argument(
    env: dict[str, str], rds: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["send", "save", A, C, "cli save", "--wait", "0"], capsys)
    assert code == 0, err
    entries: Any = rds.xrange(keys.stream(keys.shard_of(A, C, 4)))
    [(_, fields)] = entries
    event = json.loads(fields[b"e"])
    assert (event["description"], event["event_id"]) == ("cli save", out.strip())
    code, _, err = run(["send", "save", A, C, "one", "--description", "two"], capsys)
    assert code == 2
    assert_one_line(err, "description")


def test_status_before_migrate_says_to_migrate(
    env: dict[str, str],
    db: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import psycopg

    base = os.environ["DATABASE_URL"]
    name = f"contextlog_empty_{os.getpid()}"
    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        # with_database keeps a query string (the embedded server's ?host=/socket/dir)
        monkeypatch.setenv("DATABASE_URL", services.with_database(base, name))
        code, _, err = run(["status"], capsys)
        assert code == 2, err
        assert_one_line(err, "contextlog migrate")
    finally:
        with psycopg.connect(env["DATABASE_URL"], autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- user data is printed literally --------------------------------------------------------

MARKUP = ["[/x]", "[bold]bold[/bold]", ":smile:", "[link=http://evil]x[/link]"]


def test_dead_letters_print_markup_literally(
    env: dict[str, str],
    rds: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for i, text in enumerate(MARKUP):
        rds.xadd(
            keys.dead_letters(0),
            {
                "reason": "malformed",
                "detail": f"detail {text}",
                "stream": keys.stream(0),
                "entry_id": f"1-{i}",
                "orig:e": text,
            },
        )
    monkeypatch.setattr(console, "width", 400)  # no wrapping inside the cells
    code, out, err = run(["dead-letters"], capsys)
    assert code == 0, err
    for text in MARKUP:
        assert f"detail {text}" in out and repr({"e": text}) in out, out


# --- export and import -------------------------------------------------------------------


class Conversation:
    """Ingest running; a producer and notifications as the CLI's adapter sees them."""

    def __init__(self, db: str, redis_url: str) -> None:
        self.producer = Producer(redis.Redis.from_url(redis_url), shards=4)
        self.reader = ContextReader.from_url(db)
        self.notes = Notifications(redis.Redis.from_url(redis_url), "cli", consumer="t1")
        self.seen: list[Notice] = []

    def notice(self, kind: str, channel: str | None = None) -> Notice:
        def arrived() -> bool:
            got = self.notes.read(block_ms=50)
            self.notes.ack(got)
            self.seen.extend(got)
            return any(n.kind == kind and channel in (None, n.channel) for n in self.seen)

        eventually(arrived, 20, f"a {kind} notice")
        found = next(n for n in self.seen if n.kind == kind and channel in (None, n.channel))
        self.seen.remove(found)
        return found

    def close(self) -> None:
        self.producer.close()
        self.reader.close()
        self.notes.close()


@pytest.fixture
def conv(env: dict[str, str], db: str, redis_url: str) -> Iterator[Conversation]:
    logs.configure("warning", "console")  # ingest's logs stay out of the CLI's output
    c = Conversation(db, redis_url)
    with running(settings_for(db, redis_url)):
        yield c
    c.close()


TOOL_SESSION: list[tuple[str, Any]] = [
    ("user", "What is the weather in Paris?"),
    (
        "assistant",
        [
            {"type": "text", "text": "Let me check."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "weather",
                "input": {"city": "Paris", "units": ["C"], "deep": {"a": [1, 2.5, None]}},
            },
        ],
    ),
    (
        "user",
        [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C, cloudy"}],
    ),
    ("assistant", "It is 18 C and cloudy in Paris."),
]


def test_export_import_round_trip_of_a_session_with_tools(
    conv: Conversation,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for role, content in TOOL_SESSION:
        conv.producer.post_message(A, C, role, content, source="cli")
    conv.producer.save(A, C, "weather", source="cli")
    sid = conv.notice(nt.SESSION_SAVED).session_id or ""

    monkeypatch.chdir(tmp_path)
    code, out, err = run(["export", sid, "--agent", A, "--channel", C], capsys)
    assert code == 0, err
    exported = Path(out.strip())
    assert exported == tmp_path / f"{sid}.json"
    doc = json.loads(exported.read_text())
    assert [(m["role"], m["content"]) for m in doc["messages"]] == TOOL_SESSION

    code, out, err = run(["import", str(exported), "--agent", A, "--channel", "dm"], capsys)
    assert code == 0, err
    assert out.splitlines()[-1] == f"imported session {sid} ({len(TOOL_SESSION)} messages)", out
    assert out.startswith(f"sent session {sid} ({len(TOOL_SESSION)} messages) to {A}/dm")
    assert conv.notice(nt.SESSION_IMPORTED, "dm").session_id == sid
    _, messages = conv.reader.session_messages(sid, agent=A, channel="dm")
    assert [(m.role, m.content) for m in messages] == TOOL_SESSION

    again = tmp_path / "again.json"
    code, _, err = run(["export", sid, "--agent", A, "--channel", "dm", "-o", str(again)], capsys)
    assert code == 0, err
    moved = json.loads(again.read_text())["messages"]
    assert [(m["role"], m["content"]) for m in moved] == TOOL_SESSION
    # Moved twice, each message keeps the time it was first written, not the import's.
    assert [m["occurred_at"] for m in moved] == [m["occurred_at"] for m in doc["messages"]]


def test_session_commands_wait_for_ingests_answer(
    conv: Conversation, capsys: pytest.CaptureFixture[str]
) -> None:
    """`send restore ... no-such-session` exits 2 with the reason ingest gave, not 0."""
    code, _, err = run(["send", "restore", A, C, "no-such-session"], capsys)
    assert code == 2
    assert_one_line(err, "restore refused: there is no session 'no-such-session'")
    conv.producer.post_message(A, C, "user", "something to save", source="cli")
    code, out, err = run(["send", "save", A, C, "kept"], capsys)
    assert code == 0, err
    eid, said = out.splitlines()
    assert said.startswith("saved session ") and said.endswith("_kept (1 messages)")
    assert conv.notice(nt.SESSION_SAVED).event_id == eid  # an adapter's group still gets it
    code, out, err = run(["send", "delete-session", A, C, "nope", "--wait", "0"], capsys)
    assert (code, len(out.splitlines()), err) == (0, 1, "")  # not waited for


def test_export_keeps_an_existing_file_unless_forced(
    conv: Conversation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conv.producer.post_message(A, C, "user", "to export", source="cli")
    conv.producer.save(A, C, "exported", source="cli")
    sid = conv.notice(nt.SESSION_SAVED).session_id or ""
    mine = tmp_path / "mine.json"
    mine.write_text("my notes\n")
    argv = ["export", sid, "--agent", A, "--channel", C, "-o", str(mine)]
    code, _, err = run(argv, capsys)
    assert code == 2
    assert_one_line(err, f"{mine} exists: give --force to overwrite it, or -o another file")
    assert mine.read_text() == "my notes\n"
    code, _, err = run([*argv, "--force"], capsys)
    assert code == 0, err
    assert json.loads(mine.read_text())["session_id"] == sid


def test_export_of_another_conversations_session_reads_as_unknown(
    conv: Conversation, capsys: pytest.CaptureFixture[str]
) -> None:
    conv.producer.post_message(A, "other", "user", "theirs", source="cli")
    conv.producer.save(A, "other", "theirs", source="cli")
    theirs = conv.notice(nt.SESSION_SAVED).session_id or ""
    conv.producer.post_message(A, C, "user", "mine", source="cli")
    conv.producer.save(A, C, "mine", source="cli")
    conv.notice(nt.SESSION_SAVED)

    code, _, foreign = run(["export", theirs, "--agent", A, "--channel", C], capsys)
    assert code == 2
    code, _, unknown = run(["export", "2000-01-01_nothing", "--agent", A, "--channel", C], capsys)
    assert code == 2
    assert foreign.replace(theirs, "ID") == unknown.replace("2000-01-01_nothing", "ID")
    assert_one_line(foreign, "no session")
    code, _, err = run(["export", theirs, "--agent", "beta", "--channel", "other"], capsys)
    assert (code, err) == (2, foreign)

    conv.producer.restore(A, C, theirs, source="cli")
    assert conv.notice(nt.COMMAND_REFUSED).text == f"there is no session {theirs!r}"


def test_sessions_of_all_channels_name_each_channel(
    conv: Conversation, capsys: pytest.CaptureFixture[str]
) -> None:
    conv.producer.post_message(A, "[bold]room[/bold]", "user", "hello [/x] :smile:", source="cli")
    conv.producer.save(A, "[bold]room[/bold]", source="cli")
    sid = conv.notice(nt.SESSION_SAVED).session_id
    code, out, err = run(["sessions", A], capsys)
    assert code == 0, err
    assert f"{sid}  [bold]room[/bold]  " in out and "hello [/x] :smile:" in out, out
    code, out, err = run(["context", A, "[bold]room[/bold]"], capsys)
    assert code == 0 and "hello [/x] :smile:" in out, err


LONGEST_SLUG = "x" * 40  # sessions.MAX_SLUG: the longest id a description gives


@pytest.mark.parametrize("through", ["a terminal of 80 columns", "a pipe"])
def test_sessions_keep_ids_whole_and_each_on_two_lines(
    through: str,
    conv: Conversation,
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Ids are copied from this list into `restore` and `export`: never broken, however
    narrow the terminal; a long description or summary is cut to the width instead of
    wrapping over dozens of lines (`--json` has it whole)."""
    ids = []
    for n, description in enumerate([LONGEST_SLUG, "word " * 99, LONGEST_SLUG]):
        conv.producer.post_message(A, C, "user", f"message {n}", source="cli")
        conv.producer.save(A, C, description, source="cli")
        ids.append(conv.notice(nt.SESSION_SAVED).session_id or "")
    assert len(ids[2]) > 51  # 2026-11-22_ + 40 + "-2"
    if through == "a pipe":
        done = subprocess.run(
            [CONTEXTLOG, "sessions", A, "--channel", C],
            env={k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")},
            capture_output=True,
            text=True,
            timeout=30,
        )
        code, out = done.returncode, done.stdout
    else:
        monkeypatch.setattr(console, "width", 80)
        code, out, _ = run(["sessions", A, "--channel", C], capsys)
    assert code == 0, out
    lines = out.splitlines()
    assert len(lines) == 1 + 2 * len(ids), out  # a title, then two lines a session
    for sid in ids:
        assert any(line.startswith(sid + " ") for line in lines), (sid, out)
    assert all(len(line) <= 80 for line in lines), out
    assert lines[4].startswith("    word word") and lines[4].endswith("…"), out


# Deeper than ingest takes (codec.MAX_NESTING), shallow enough for the file's decoder.
DEEP_INPUT = [
    {
        "type": "tool_use",
        "id": "t1",
        "name": "f",
        "input": json.loads('{"a":' + "[" * 100 + "]" * 100 + "}"),
    }
]


def stream_lengths(rds: redis.Redis) -> int:
    return sum(int(rds.xlen(keys.stream(i))) for i in range(4))


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("nul \u0000 inside", "U+0000"),
        ([{"type": "tool_use", "id": "t1", "name": "f", "input": [1, 2]}], "JSON object"),
        ([{"type": "text", "text": "x" * 150_000}] * 2, "message 3 of 3: oversized"),
        (DEEP_INPUT, "message 3 of 3: invalid: JSON nests"),
    ],
    ids=["nul", "tool-input-array", "oversized", "nesting-over-ingest-limit"],
)
def test_import_refuses_what_ingest_would_and_sends_nothing(
    content: Any,
    fragment: str,
    env: dict[str, str],
    rds: redis.Redis,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = export_file(tmp_path, [*HELLO, {"role": "user", "content": content}])
    code, _, err = run(["import", str(path), "--agent", A, "--channel", C], capsys)
    assert code == 2, err
    assert_one_line(err, fragment)
    assert stream_lengths(rds) == 0


def test_import_refuses_times_ingest_would_refuse(
    env: dict[str, str], rds: redis.Redis, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = export_file(tmp_path, HELLO, timestamp="2200-01-01T00:00:00Z")
    code, _, err = run(["import", str(path), "--agent", A, "--channel", C], capsys)
    assert code == 2, err
    assert_one_line(err, "the session: ")
    assert stream_lengths(rds) == 0


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b'{"format": "contextlog.session.v1", "session_id": "\xff\xfe"}', "UTF-8"),
        (b'{"format": "contextlog.session.v1", "messages": ' + DEEP + b"}", "not a contextlog"),
        (
            b'{"format":"contextlog.session.v1","session_id":"s","timestamp":'
            b'"2025-01-02T10:00:00Z","message_count":1,"messages":[{"role":"user","content":'
            b'[{"type":"tool_use","id":"t","name":"f","input":' + DEEP + b"}]}]}",
            "nest",
        ),
        (b"not json", "not valid JSON"),
        (b'{"format": "other"}', "not a contextlog session export"),
    ],
    ids=["utf8", "deep", "deep-tool-input", "garbage", "wrong-format"],
)
def test_import_of_a_bad_file_exits_2_without_a_traceback(
    data: bytes,
    fragment: str,
    env: dict[str, str],
    rds: redis.Redis,
    tmp_path: Path,
) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(data)
    done = subprocess.run(
        [CONTEXTLOG, "import", str(path), "--agent", A, "--channel", C],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert_one_line(done.stderr, fragment)
    assert stream_lengths(rds) == 0


def test_import_reads_at_most_the_cap_from_a_fifo(
    env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(archive, "MAX_FILE_BYTES", 1 << 20)
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    written = [0]

    def feed() -> None:
        chunk = b" " * 65536
        try:
            with fifo.open("wb") as f:
                for _ in range(80 * 16):  # 80 MiB, unless the reader stops first
                    f.write(chunk)
                    written[0] += len(chunk)
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    code, _, err = run(["import", str(fifo), "--agent", A, "--channel", C], capsys)
    writer.join(timeout=30)
    assert code == 2, err
    assert_one_line(err, "limit")
    assert written[0] < 8 << 20  # the reader stopped after cap + 1 bytes
