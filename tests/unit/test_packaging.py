"""How the project installs: one `contextlog` namespace, and adapters need only the core."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

from contextlog.worker.cli import extras

ROOT = Path(__file__).resolve().parents[2]
WORKER_ONLY = ("rq", "anthropic", "rich", "structlog", "prometheus_client")
DASHBOARD_ONLY = ("rq_dashboard", "six", "flask", "werkzeug")
# Makes `import X` fail as in an install without X, for X in MISSING (set by the caller).
BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in MISSING:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
"""


def run_without(
    missing: tuple[str, ...], code: str, cwd: str = "/"
) -> subprocess.CompletedProcess[str]:
    """Python `code` in a process where the `missing` modules cannot be imported."""
    program = f"MISSING = {missing!r}\n{BLOCKER}\n{code}"
    return subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def test_an_adapter_imports_producers_without_the_worker_dependencies() -> None:
    """The plain install (no extra) is enough for a bot: pushing events, reading context
    and sessions, receiving notifications."""
    blocker = f"""
from contextlog.producers import (
    AsyncContextReader, AsyncProducer, ContextReader, Notifications, Producer,
)
from contextlog.schema import codec, events, keys
p = Producer.from_url("redis://127.0.0.1:1/0")
r = ContextReader.from_url("postgresql://127.0.0.1:1/none")
assert not any(m.split(".")[0] in {WORKER_ONLY!r} for m in sys.modules)
print("ok")
"""
    done = run_without(WORKER_ONLY, blocker)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_distribution_and_its_extras() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "contextlog-memory"  # `contextlog` on PyPI is someone else's
    core = {d.split("[")[0].split("=")[0] for d in project["dependencies"]}
    assert core == {"redis", "msgspec", "psycopg", "psycopg-pool"}
    worker = {d.split("[")[0].split("=")[0] for d in project["optional-dependencies"]["worker"]}
    assert {"rq", "anthropic", "rich", "structlog", "prometheus-client"} <= worker
    assert project["scripts"]["contextlog"] == "contextlog.worker.cli.script:main"


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


def dist_modules(requirements: list[str]) -> set[str]:
    """The top-level module of each requirement that is not this project itself."""
    names = {re.split(r"[\[=<>]", r)[0] for r in requirements}
    return {n.replace("-", "_") for n in names if n != "contextlog-memory"}


def test_the_console_script_knows_which_extra_brings_each_module() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra, modules in extras.EXTRA_MODULES.items():
        assert set(modules) == dist_modules(declared[extra]), extra


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    return done.stderr


def test_the_plain_install_names_the_extra_the_command_needs() -> None:
    """`contextlog --help` without the `worker` extra: one line saying what to install."""
    code = "from contextlog.worker.cli.script import main; sys.exit(main(['--help']))"
    line = one_line_error(run_without(WORKER_ONLY + DASHBOARD_ONLY, code))
    assert line.startswith("contextlog: this command needs the `worker` extra")
    assert "pip install './contextlog[worker]'" in line


def test_the_dashboard_without_its_extra_names_it() -> None:
    code = "from contextlog.worker.cli.script import main; sys.exit(main(['dashboard']))"
    line = one_line_error(run_without(DASHBOARD_ONLY, code))
    assert line.startswith("contextlog: this command needs the `dashboard` extra (module ")
    assert "[dashboard]" in line


def test_the_api_without_its_extra_names_it() -> None:
    code = "from contextlog.worker.cli.script import main; sys.exit(main(['api']))"
    line = one_line_error(run_without(("starlette", "uvicorn"), code))
    assert line.startswith("contextlog: this command needs the `api` extra (module ")
    assert "[api]" in line


def readme_install_lines() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Install") : readme.index("## What it does")]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    return [line.split("#")[0].strip() for line in block[1].splitlines()]


def test_the_readme_install_lines_work_as_written(tmp_path: Path) -> None:
    """README's Install, run offline from a copy of the checkout named `contextlog`: the
    wheel it builds is the one it names, installs, holds the console script, and the
    package it installs is the one imported."""
    checkout = tmp_path / "contextlog"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, checkout / name)
    for folder in ("schema", "producers", "worker"):
        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / folder, checkout / folder, ignore=skip)
    lines = readme_install_lines()
    wheel_line = next(line for line in lines if line.startswith("pip wheel"))
    assert wheel_line == "pip wheel --no-deps -w dist ./contextlog"
    # The line as written, offline: the build backend comes from this venv.
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = [*pip, *wheel_line.split()[1:], "--no-build-isolation", "--no-index"]
    subprocess.run(build, cwd=tmp_path, check=True, capture_output=True, timeout=120)
    install_line = next(line for line in lines if ".whl" in line)
    wheel = install_line.split()[-1].strip("'").removesuffix("[worker]")
    assert (tmp_path / wheel).is_file(), sorted(p.name for p in (tmp_path / "dist").iterdir())
    with zipfile.ZipFile(tmp_path / wheel) as whl:
        meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        assert "Name: contextlog-memory" in whl.read(meta).decode().splitlines()
        points = next(n for n in whl.namelist() if n.endswith(".dist-info/entry_points.txt"))
        assert "contextlog = contextlog.worker.cli.script:main" in whl.read(points).decode()
    site = tmp_path / "site"
    install = [*pip, "install", "--no-deps", "--no-index", "--target", str(site), wheel]
    subprocess.run(install, cwd=tmp_path, check=True, capture_output=True, timeout=120)
    # -S: no .pth files, so this checkout's editable install stays out of the way; the
    # venv's site-packages still give the dependencies.
    deps = sysconfig.get_paths()["purelib"]
    probe = (
        "import contextlog.producers, contextlog.worker.cli.script as s;"
        "print(contextlog.producers.__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe],
        env={"PYTHONPATH": f"{site}:{deps}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(site)), done.stdout
