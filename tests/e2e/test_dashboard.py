"""`contextlog dashboard` as operators see it: rq-dashboard rendered in headless Chromium
over a Redis holding the project's real jobs, and basic auth when it is configured."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path

import pytest
import redis
from rq import Queue, SimpleWorker

from contextlog.worker.tasks.queue import FAILURE_TTL, SUMMARIES, Jobs
from contextlog.worker.tasks.timers import Timers, bucket_second, ms
from tests.support import services
from tests.support.processes import ROOT, Process, started
from tests.support.running import eventually
from tests.support.servers import free_port

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")  # Debian's package `chromium`
# rq-dashboard fills its tables from JSON it polls every 2.5 s. Chromium's virtual clock
# runs this long before the DOM is dumped, and stands still while a request is in flight:
# the first poll has landed and been rendered, with no wall-clock wait and no second poll.
BUDGET_MS = 1500
SCREENSHOT = ROOT / "docs" / "dashboard.png"
USER, PASSWORD = "ops", "dashboard-Secret-42"

A, C = "alpha", "general"
AUTH_REFACTOR = "2026-11-22_auth-refactor"
REFUND_POLICY = "2026-11-21_refund-policy"
RELEASE_NOTES = "2026-11-20_release-notes"
# rq-dashboard's queue table: the name, then these counts.
COLUMNS = ("queued", "deferred", "scheduled", "started", "finished", "failed", "canceled")


def chromium_or_skip() -> Path:
    """The browser, or skip (in CI, fail) saying how to install it."""
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: install Debian's package with `apt-get install chromium`"
        if services.IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return CHROMIUM


def status(url: str, credentials: tuple[str, str] | None = None) -> int:
    """The HTTP status of a GET, with basic auth if given."""
    request = urllib.request.Request(url)
    if credentials is not None:
        token = base64.b64encode(":".join(credentials).encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def answers(url: str) -> bool:
    """The dashboard serves requests (a 401 counts: basic auth is on)."""
    try:
        status(url + "/0/data/queues.json")
    except OSError:
        return False
    return True


@contextmanager
def dashboard(redis_url: str, log: Path, **settings: str) -> Iterator[tuple[str, Process]]:
    """A running `contextlog dashboard` on a free port; yields its base URL."""
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CONTEXTLOG_DASHBOARD_", "RQ_DASHBOARD_"))  # the test's own
    }
    env |= {"REDIS_URL": redis_url, "CONTEXTLOG_DASHBOARD_PORT": str(port), **settings}
    url = f"http://127.0.0.1:{port}"
    with started("dashboard", env, log) as p:
        assert p.proc is not None
        proc = p.proc
        try:
            eventually(lambda: proc.poll() is not None or answers(url), timeout=30, what=url)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{p.tail()}") from None
        assert proc.poll() is None, f"contextlog dashboard exited:\n{p.tail()}"
        yield url, p


def browse(pages: dict[str, list[str]], tmp: Path) -> dict[str, str]:
    """Load each URL (with its extra Chromium options) in headless Chromium and let its
    scripts run; returns each page's DOM as rendered. A launch costs a second or more,
    so the browsers run side by side, each on its own profile."""
    chromium = chromium_or_skip()
    running: dict[str, tuple[subprocess.Popen[bytes], Path, Path]] = {}
    try:
        for i, (url, extra) in enumerate(pages.items()):
            dom, errors = tmp / f"page{i}.html", tmp / f"page{i}.log"
            argv = [
                str(chromium),
                "--headless=new",
                "--no-sandbox",  # tests may run as root, where Chromium's sandbox will not start
                "--disable-gpu",
                "--disable-dev-shm-usage",  # containers give /dev/shm 64 MB
                "--hide-scrollbars",
                f"--user-data-dir={tmp / f'profile{i}'}",
                f"--virtual-time-budget={BUDGET_MS}",
                "--dump-dom",
                *extra,
                url,
            ]
            with dom.open("wb") as out, errors.open("wb") as err:
                running[url] = (subprocess.Popen(argv, stdout=out, stderr=err), dom, errors)
        for url, (proc, _, errors) in running.items():
            code = proc.wait(timeout=60)
            assert code == 0, f"chromium failed on {url}:\n{errors.read_text()[-2000:]}"
    finally:
        for proc, _, _ in running.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {url: dom.read_text() for url, (_, dom, _) in running.items()}


class Rendered(HTMLParser):
    """The rows rq-dashboard's scripts rendered: its row templates sit inside <script>,
    which the parser leaves unparsed, so only real rows are seen."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.queues: dict[str, dict[str, int]] = {}
        self.jobs: list[str] = []  # descriptions, as listed
        self._row: str | None = None  # data-role of the row being read
        self._cells: list[str] = []
        self._in_description = False
        self.feed(dom)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr" and a.get("data-role") in ("queue", "job"):
            self._row, self._cells = a["data-role"], []
        elif tag == "td" and self._row == "queue":
            self._cells.append("")
        elif tag == "span" and self._row == "job" and "description" in (a.get("class") or ""):
            self._in_description = True
            self.jobs.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "span":
            self._in_description = False
        elif tag == "tr" and self._row == "queue":
            name, *counts = (" ".join(c.split()) for c in self._cells)
            self.queues[name] = dict(zip(COLUMNS, map(int, counts), strict=True))
            self._row = None
        elif tag == "tr":
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._in_description:
            self.jobs[-1] += data
        elif self._row == "queue" and self._cells:
            self._cells[-1] += data


def fill(client: redis.Redis, now: dt.datetime) -> str:
    """The jobs of a busy deployment, made by the project's own code; returns the
    description of the idle check it schedules."""
    summaries = Queue(SUMMARIES, connection=client)
    # A job queued by an older release whose function has since been renamed: the worker
    # cannot import it and fails it, the way a deploy leaves a failed job behind.
    summaries.enqueue_call(
        "contextlog.worker.tasks.jobs.summarise_session",
        args=(A, C, RELEASE_NOTES),
        description=f"summarize session {RELEASE_NOTES} ({A}/{C})",
        failure_ttl=FAILURE_TTL,
    )
    SimpleWorker([summaries], connection=client).work(burst=True, logging_level="ERROR")
    jobs = Jobs(client)
    assert jobs.summarize(A, C, AUTH_REFACTOR)
    assert jobs.summarize("beta", "support", REFUND_POLICY)
    assert jobs.compact(A, C)
    due = now + dt.timedelta(minutes=30)
    assert Timers(client).arm_many([(A, C, due)], now) == 1
    fires = dt.datetime.fromtimestamp(bucket_second(ms(due)), dt.UTC)
    return f"idle checks due at {fires:%H:%M:%S} UTC"


def test_dashboard_shows_the_queues_and_readable_jobs(
    rds: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    chromium_or_skip()
    idle_check = fill(rds, dt.datetime.now(dt.UTC))
    shot = SCREENSHOT if os.environ.get("CONTEXTLOG_SCREENSHOT") == "1" else tmp_path / "shot.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    shot.unlink(missing_ok=True)
    with dashboard(redis_url, tmp_path / "dashboard.log") as (url, _):
        queues, queued, scheduled = (
            f"{url}/0/view/queues",
            f"{url}/0/view/jobs/summaries/queued/8/asc/1",
            # The idle check waits for its deadline in RQ's scheduled registry.
            f"{url}/0/view/jobs/idle/scheduled/8/asc/1",
        )
        shoot = [f"--screenshot={shot}", "--window-size=1280,680"]
        dom = browse({queues: [], queued: shoot, scheduled: []}, tmp_path)

    counts = Rendered(dom[queues]).queues
    assert set(counts) == {"idle", "summaries"}
    assert counts["summaries"]["queued"] == 3 and counts["summaries"]["failed"] == 1
    assert counts["idle"]["scheduled"] == 1 and counts["idle"]["queued"] == 0
    assert Rendered(dom[queued]).jobs == [
        f"summarize session {AUTH_REFACTOR} ({A}/{C})",
        f"summarize session {REFUND_POLICY} (beta/support)",
        f"compact context ({A}/{C})",
    ]
    assert Rendered(dom[scheduled]).jobs == [idle_check]
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_dashboard_asks_for_basic_auth_when_configured(redis_url: str, tmp_path: Path) -> None:
    creds = {"CONTEXTLOG_DASHBOARD_USER": USER, "CONTEXTLOG_DASHBOARD_PASSWORD": PASSWORD}
    with dashboard(redis_url, tmp_path / "dashboard.log", **creds) as (url, p):
        for page in ("/0/view/queues", "/0/data/queues.json"):
            assert status(url + page) == 401
            assert status(url + page, (USER, "wrong")) == 401
            assert status(url + page, (USER, PASSWORD)) == 200
        assert p.proc is not None
        # The password reaches rq-dashboard by environment: `ps` never shows it.
        cmdline = Path(f"/proc/{p.proc.pid}/cmdline").read_bytes()
        assert PASSWORD.encode() not in cmdline
    log = (tmp_path / "dashboard.log").read_text()
    assert PASSWORD not in log


def test_dashboard_starts_quietly(redis_url: str, tmp_path: Path) -> None:
    """One info line says where it listens: no banner, no address logged as an error,
    and no line per poll of an open page."""
    log = tmp_path / "dashboard.log"
    with dashboard(redis_url, log, CONTEXTLOG_LOG_FORMAT="json") as (url, _):
        for _ in range(3):
            assert status(url + "/0/data/queues.json") == 200
    printed = log.read_text().splitlines()
    records = [json.loads(line) for line in printed if line.startswith("{")]
    assert [line for line in printed if not line.startswith(("{", "---"))] == []
    assert [(r["level"], r["event"], r["url"]) for r in records] == [
        ("info", "dashboard listening", url)
    ]
