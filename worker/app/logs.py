"""Structured logs (structlog): JSON lines on stderr, or a console form for people."""

from __future__ import annotations

import logging
import sys

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure(level: str = "info", fmt: str = "json") -> None:
    """Set up structlog once per process; never logs message content at info level."""
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # Looked up on every call, not cached: sys.stderr may be replaced (tests, daemons).
        logger_factory=lambda *args: structlog.PrintLogger(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    _route_stdlib(level, renderer)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler on the stderr of the moment (tests replace sys.stderr)."""

    name = "contextlog"

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def _route_stdlib(level: str, renderer: structlog.typing.Processor) -> None:
    """Libraries' logs (RQ's worker and scheduler, psycopg_pool) in the same format: a
    root handler also stops RQ from installing its own plain-text one."""
    root = logging.getLogger()
    for h in [h for h in root.handlers if h.name == _Stderr.name]:
        root.removeHandler(h)
    handler = _Stderr()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processor=renderer,
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
            ],
        )
    )
    root.addHandler(handler)
    root.setLevel(_LEVELS[level])
