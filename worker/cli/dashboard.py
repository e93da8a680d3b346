"""`contextlog dashboard`: rq-dashboard's Flask app on the queue Redis, served quietly.

The app is built here rather than through rq-dashboard's own command line, which prints
banners on stdout, logs its address at error level, and opens its Jobs tab on RQ's
`default` queue, which contextlog never uses."""

from __future__ import annotations

import argparse
import logging
import re
from types import SimpleNamespace
from typing import Any, Final

import structlog

from contextlog.schema.errors import ConfigError
from contextlog.worker.app.config import Settings
from contextlog.worker.cli.extras import install_hint
from contextlog.worker.tasks.queue import SUMMARIES

log = structlog.get_logger("contextlog.dashboard")

LOOPBACK: Final = ("127.0.0.1", "localhost", "::1")
# rq-dashboard's Jobs tab without a queue (`/<instance>/view/jobs`) shows RQ's `default`.
_JOBS_TAB: Final = re.compile(r"^/(\d+)/view/jobs/?$")


def check_exposure(settings: Settings) -> None:
    """Bound to loopback unless told otherwise, and never beyond it without basic auth."""
    exposed = settings.dashboard_bind not in LOOPBACK
    if exposed and not (settings.dashboard_user and settings.dashboard_password):
        raise ConfigError(
            f"CONTEXTLOG_DASHBOARD_BIND={settings.dashboard_bind} exposes the dashboard: set "
            "CONTEXTLOG_DASHBOARD_USER and CONTEXTLOG_DASHBOARD_PASSWORD for basic auth"
        )


def jobs_tab_target(path: str) -> str | None:
    """Where a request for the Jobs tab without a queue goes instead: the `summaries`
    queue's waiting jobs; None for any other path."""
    found = _JOBS_TAB.match(path)
    return f"/{found[1]}/view/jobs/{SUMMARIES}/queued/8/asc/1" if found else None


def _modules() -> SimpleNamespace:
    """rq-dashboard and Flask: the `dashboard` extra, which a worker's install may lack
    (so they are imported here, when the dashboard runs, not with the CLI)."""
    try:
        import flask
        import rq_dashboard.cli  # type: ignore[import-untyped]  # no stubs
        import rq_dashboard.web  # type: ignore[import-untyped]
        from werkzeug import serving
    except ModuleNotFoundError as e:
        raise ConfigError(install_hint("dashboard", e.name)) from None
    return SimpleNamespace(flask=flask, cli=rq_dashboard.cli, web=rq_dashboard.web, serving=serving)


def build_app(settings: Settings, mods: SimpleNamespace) -> Any:
    """rq-dashboard's Flask app on `CONTEXTLOG_QUEUE_REDIS_URL`, with basic auth when
    configured (the credentials never pass through argv or the environment)."""
    check_exposure(settings)
    app = mods.cli.make_flask_app(None, settings.dashboard_user, settings.dashboard_password, "")
    app.config["RQ_DASHBOARD_REDIS_URL"] = settings.queue_redis_url
    mods.web.setup_rq_connection(app)

    def jobs_on_our_queue() -> Any:
        target = jobs_tab_target(mods.flask.request.path)
        return None if target is None else mods.flask.redirect(target)

    app.before_request(jobs_on_our_queue)
    return app


def cmd_dashboard(settings: Settings, args: argparse.Namespace) -> int:
    """Serve the dashboard until interrupted; one log line says where."""
    mods = _modules()
    app = build_app(settings, mods)
    # A request line every 2.5 s per open page (rq-dashboard polls) only when debugging.
    logging.getLogger("werkzeug").setLevel(
        logging.DEBUG if settings.log_level == "debug" else logging.WARNING
    )
    bind, port = settings.dashboard_bind, settings.dashboard_port
    server = mods.serving.make_server(bind, port, app, threaded=True)
    host = f"[{bind}]" if ":" in bind else bind
    log.info("dashboard listening", url=f"http://{host}:{port}")
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
