"""How the project installs: one `contextlog` namespace, and adapters need only the core."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER_ONLY = ("rq", "anthropic", "rich", "structlog", "prometheus_client")


def test_an_adapter_imports_producers_without_the_worker_dependencies() -> None:
    """`pip install contextlog-memory` (no extra) is enough for a bot: pushing events,
    reading context and sessions, receiving notifications."""
    blocker = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {WORKER_ONLY!r}:
            raise ImportError(f"{{name}} is a worker dependency")
sys.meta_path.insert(0, Block())
from contextlog.producers import (
    AsyncContextReader, AsyncProducer, ContextReader, Notifications, Producer,
)
from contextlog.schema import codec, events, keys
p = Producer.from_url("redis://127.0.0.1:1/0")
r = ContextReader.from_url("postgresql://127.0.0.1:1/none")
assert not any(m.split(".")[0] in {WORKER_ONLY!r} for m in sys.modules)
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_distribution_and_its_extras() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "contextlog-memory"  # `contextlog` on PyPI is someone else's
    core = {d.split("[")[0].split("=")[0] for d in project["dependencies"]}
    assert core == {"redis", "msgspec", "psycopg", "psycopg-pool"}
    worker = {d.split("[")[0].split("=")[0] for d in project["optional-dependencies"]["worker"]}
    assert {"rq", "anthropic", "rich", "structlog", "prometheus-client"} <= worker
    assert project["scripts"]["contextlog"] == "contextlog.worker.cli.main:main"


def test_no_module_imports_a_bare_top_level_name() -> None:
    """`schema`, `producers`, `worker` are folders here, never import names: the bare
    names belong to other packages (PyPI's `schema`) once installed."""
    bare = []
    for folder in ("schema", "producers", "worker", "tests", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                bare += [
                    f"{path.relative_to(ROOT)}: {n}"
                    for n in names
                    if n.split(".")[0] in ("schema", "producers", "worker")
                ]
    assert bare == []
