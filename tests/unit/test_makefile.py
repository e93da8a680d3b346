"""The Makefile's targets that take what a user types: `make attach CMD=...` passes the
command to the shell as written, `$` included, and `make clean` deletes the embedded
database only when told to (a yes on a terminal, or FORCE=1)."""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = ROOT / "Makefile"
VENV = Path(sys.prefix)  # the venv running the tests; make must not reinstall it

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make(
    *args: str, cwd: Path, env: dict[str, str] | None = None, stdin: int | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-f", str(MAKEFILE), *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL if stdin is None else stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_attach_passes_the_command_to_the_shell_as_written() -> None:
    env = {**os.environ, "DATABASE_URL": "postgresql://h/db", "REDIS_URL": "redis://h/3"}
    command = """printf '%s|' "$DATABASE_URL" "it's" $REDIS_URL"""
    done = make(
        f"VENV={VENV}", "-o", f"{VENV}/.installed", "attach", f"CMD={command}", cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "postgresql://h/db|it's|redis://h/3|"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A folder with what runs leave: an embedded database and hypothesis examples."""
    (tmp_path / ".contextlog" / "pgdata").mkdir(parents=True)
    (tmp_path / ".contextlog" / "pgdata" / "PG_VERSION").write_text("18\n")
    (tmp_path / ".hypothesis" / "examples").mkdir(parents=True)
    return tmp_path


def test_clean_without_a_terminal_keeps_the_database_and_says_how(checkout: Path) -> None:
    done = make("clean", cwd=checkout)
    assert done.returncode != 0
    assert "make clean FORCE=1" in done.stderr
    assert (checkout / ".contextlog" / "pgdata").is_dir()
    assert not (checkout / ".hypothesis").exists()  # no one's data: removed all the same


def test_clean_with_force_deletes_the_database(checkout: Path) -> None:
    done = make("clean", "FORCE=1", cwd=checkout)
    assert done.returncode == 0, done.stderr
    assert not (checkout / ".contextlog").exists() and not (checkout / ".hypothesis").exists()


@pytest.mark.parametrize(
    ("answer", "deleted"), [("y", True), ("yes", True), ("n", False), ("", False)]
)
def test_clean_asks_on_a_terminal(checkout: Path, answer: str, deleted: bool) -> None:
    leader, follower = pty.openpty()
    try:
        os.write(leader, f"{answer}\n".encode())
        done = make("clean", cwd=checkout, stdin=follower)
    finally:
        os.close(follower)
        os.close(leader)
    assert done.returncode == 0, done.stderr
    assert "Delete .contextlog/, the embedded database" in done.stdout
    assert (checkout / ".contextlog").exists() is not deleted
