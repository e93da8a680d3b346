"""Which install extra brings which modules, and the one line that says what to install:
for the console script (`cli.script`), the dashboard and the API, whose imports need an
extra the plain install (what an adapter needs) lacks."""

from __future__ import annotations

from typing import Final

# Top-level modules of each extra's dependencies (pyproject.toml), by the extra that
# brings them; a test checks this against pyproject.toml.
EXTRA_MODULES: Final = {
    "worker": ("structlog", "rich", "rq", "anthropic", "prometheus_client"),
    "dashboard": ("rq_dashboard", "six"),
    "api": ("starlette", "uvicorn", "httptools", "uvloop"),
}


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
