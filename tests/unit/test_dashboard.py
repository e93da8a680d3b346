"""`contextlog dashboard` without a server: where it may listen, and its Jobs tab opening
on the project's queue instead of RQ's unused `default` (Flask's test client)."""

from __future__ import annotations

import pytest

from contextlog.schema.errors import ConfigError
from contextlog.worker.app.config import Settings
from contextlog.worker.cli import dashboard


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ("/0/view/jobs", "/0/view/jobs/summaries/queued/8/asc/1"),
        ("/1/view/jobs/", "/1/view/jobs/summaries/queued/8/asc/1"),
        ("/0/view/jobs/idle/scheduled/8/asc/1", None),
        ("/0/view/queues", None),
        ("/", None),
    ],
)
def test_the_jobs_tab_opens_on_the_summaries_queue(path: str, target: str | None) -> None:
    assert dashboard.jobs_tab_target(path) == target


def test_the_app_redirects_the_jobs_tab() -> None:
    app = dashboard.build_app(Settings(), dashboard._modules())  # connects on first query
    got = app.test_client().get("/0/view/jobs")
    assert (got.status_code, got.headers["Location"]) == (
        302,
        "/0/view/jobs/summaries/queued/8/asc/1",
    )


def test_beyond_loopback_it_needs_basic_auth() -> None:
    dashboard.check_exposure(Settings(dashboard_bind="::1"))
    with pytest.raises(ConfigError, match="CONTEXTLOG_DASHBOARD_USER"):
        dashboard.check_exposure(Settings(dashboard_bind="0.0.0.0"))
    dashboard.check_exposure(
        Settings(dashboard_bind="0.0.0.0", dashboard_user="ops", dashboard_password="pw")
    )
