"""RQ finds a job by the dotted path it was queued with: every path the code queues (and
those of jobs queued by earlier versions) resolves to a function, and a job that runs in a
process the composition root did not set up says how to run it."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from rq.utils import import_attribute

from contextlog.schema.errors import ConfigError
from contextlog.worker.tasks import jobs, resources
from contextlog.worker.tasks.queue import JOBS_MODULE

ROOT = Path(__file__).resolve().parents[2]
# A path as the code spells it: literal, or on the module constant of the job functions.
PATH = re.compile(r'"(contextlog\.worker\.[a-z_.]+)"|f"\{(?:JOBS_MODULE|_JOBS)\}\.([a-z_]+)"')
# Functions queued by earlier versions that must still resolve (worker/jobs.py).
LEGACY = ["summarize_session", "compact_conversation", "idle_due", "idle_part", "idle_check"]


def queued_paths() -> set[str]:
    found = set()
    for path in (ROOT / "worker").rglob("*.py"):
        for literal, name in PATH.findall(path.read_text()):
            if literal and literal.count(".") >= 3 and not literal.endswith(".py"):
                found.add(literal)
            elif name:
                found.add(f"{JOBS_MODULE}.{name}")
    return found


def test_every_path_the_code_queues_names_a_function() -> None:
    # A dotted path that is not a module (a logger's or a `-m` name is) names a job.
    jobs_ = {p for p in queued_paths() if not _module(p)}
    assert {f"{JOBS_MODULE}.summarize_session", f"{JOBS_MODULE}.idle_due"} <= jobs_
    assert "contextlog.worker.tasks.webhooks.deliver_webhook" in jobs_
    for path in [*sorted(jobs_), *(f"contextlog.worker.jobs.{n}" for n in LEGACY)]:
        assert callable(import_attribute(path)), path


def _module(path: str) -> bool:
    try:
        return importlib.util.find_spec(path) is not None
    except ModuleNotFoundError:  # its parent is a module, not a package: an attribute
        return False


def test_a_job_outside_contextlog_worker_says_how_to_run_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resources, "_installed", {})
    with pytest.raises(ConfigError, match="`contextlog worker`"):
        jobs.summarize_session("alpha", "general", "2026-11-26_x")
