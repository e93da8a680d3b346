"""What jobs use: built once per worker process by the composition root
(`app/bootstrap.py`), which installs it before the RQ worker starts. An RQ entry point
takes it with `current()` and passes it to the job's core; nothing deeper reaches for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from contextlog.schema.errors import ConfigError

if TYPE_CHECKING:  # the classes of what is passed in; importing them costs the SDK
    from contextlog.producers.producer import Producer
    from contextlog.producers.reader import ContextReader
    from contextlog.worker.app.clock import Clock
    from contextlog.worker.app.config import Settings
    from contextlog.worker.tasks.compaction import ApiCompactor
    from contextlog.worker.tasks.summarize import Summarizer
    from contextlog.worker.tasks.timers import Timers


@dataclass
class Resources:
    """The clients and tools of a worker process's jobs."""

    settings: Settings
    reader: ContextReader
    producer: Producer  # the worker's: it signs results
    summarizer: Summarizer
    clock: Clock
    timers: Timers
    compactor: ApiCompactor | None = None  # the API's compaction (with an API key)


_installed: dict[int, Resources] = {}  # by pid: a forked child must have its own


def install(res: Resources) -> None:
    """Make `res` what this process's jobs use (`contextlog worker`, and tests)."""
    _installed.clear()
    _installed[os.getpid()] = res


def installed() -> Resources | None:
    """This process's resources, if the root installed them."""
    return _installed.get(os.getpid())


def current() -> Resources:
    """This process's resources, for an RQ entry point."""
    res = installed()
    if res is None:
        raise ConfigError(
            "this process has no job resources: run contextlog's jobs with `contextlog "
            "worker` (a plain `rq worker` does not build them)"
        )
    return res
