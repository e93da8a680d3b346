"""The `contextlog` console script: the plain install (what an adapter needs) lacks the
worker's dependencies, so this names the extra to install, in one line, before the CLI
that imports them is loaded."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Final

# Top-level modules of each extra's dependencies (pyproject.toml), by the extra that
# brings them; a test checks this against pyproject.toml.
EXTRA_MODULES: Final = {
    "worker": ("structlog", "rich", "rq", "anthropic", "prometheus_client"),
    "dashboard": ("rq_dashboard", "six"),
}
EXIT_ERROR: Final = 2  # the CLI's code for bad configuration (cli.common.EXIT_ERROR)


def extra_for(error: ModuleNotFoundError) -> str | None:
    """The extra whose dependency `error` says is missing, or None if it is no extra's."""
    top = (error.name or "").split(".")[0]
    return next((extra for extra, mods in EXTRA_MODULES.items() if top in mods), None)


def install_hint(extra: str, missing: str | None) -> str:
    """One line: which extra to install, and how while the package is not on PyPI."""
    return (
        f"this command needs the `{extra}` extra (module {missing!r} is missing): install"
        f" contextlog-memory[{extra}] the way contextlog was installed, e.g."
        f" `pip install './contextlog[{extra}]'` from a checkout (README.md, Install)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI, or say in one line which extra it needs."""
    try:
        # Imported here, not at the top: importing it is what needs the extra.
        from contextlog.worker.cli.main import main as cli_main
    except ModuleNotFoundError as e:
        extra = extra_for(e)
        if extra is None:
            raise
        print(f"contextlog: {install_hint(extra, e.name)}", file=sys.stderr)
        return EXIT_ERROR
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
