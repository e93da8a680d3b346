"""Structured logs (structlog): JSON lines on stderr, or a console form for people."""

from __future__ import annotations

import logging
import sys
from typing import Final

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
# Lines libraries repeat on a timer and that say nothing new (RQ's maintenance every 15 s,
# three lines each time): logged at debug. (logger, start of the message format)
ROUTINE: Final = (("rq.worker", "Worker %s: cleaning "),)


def console_form(fmt: str) -> bool:
    """Whether `fmt` (auto, json, console) means the console form on this stderr."""
    return fmt == "console" or (fmt == "auto" and sys.stderr.isatty())


def configure(level: str = "info", fmt: str = "auto", timestamps: bool = True) -> None:
    """Set up structlog once per process; never logs message content at info level.

    Colours only on a terminal: a console-form log redirected to a file stays plain."""
    console = console_form(fmt)
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        if console
        else structlog.processors.JSONRenderer()
    )
    stamp: list[structlog.typing.Processor] = (
        [structlog.processors.TimeStamper(fmt="iso", utc=True)] if timestamps or not console else []
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            *stamp,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # Looked up on every call, not cached: sys.stderr may be replaced (tests, daemons).
        logger_factory=lambda *args: structlog.PrintLogger(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    _route_stdlib(level, renderer, stamp)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler on the stderr of the moment (tests replace sys.stderr)."""

    name = "contextlog"

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


class _Routine(logging.Filter):
    """Moves the ROUTINE lines down to debug (and out, unless the level is debug)."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        if not any(
            record.name == name and str(record.msg).startswith(start) for name, start in ROUTINE
        ):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return self.level <= logging.DEBUG


def _route_stdlib(
    level: str, renderer: structlog.typing.Processor, stamp: list[structlog.typing.Processor]
) -> None:
    """Libraries' logs (RQ's worker and scheduler, psycopg_pool) in the same format: a
    root handler also stops RQ from installing its own plain-text one."""
    root = logging.getLogger()
    for h in [h for h in root.handlers if h.name == _Stderr.name]:
        root.removeHandler(h)
    handler = _Stderr()
    handler.addFilter(_Routine(_LEVELS[level]))
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processor=renderer,
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.processors.add_log_level,
                *stamp,
            ],
        )
    )
    root.addHandler(handler)
    root.setLevel(_LEVELS[level])
