"""Named SQL queries and migrations, read once from the `.sql` files beside this module."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{3})_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    """One numbered schema migration."""

    version: int
    name: str
    sql: str


@cache
def queries() -> dict[str, str]:
    """All named queries of the non-migration `.sql` files in `sql/`, by name."""
    found: dict[str, str] = {}
    for entry in sorted(resources.files("contextlog.schema").joinpath("sql").iterdir(), key=str):
        if not entry.name.endswith(".sql") or _MIGRATION.match(entry.name):
            continue
        parts = _NAME.split(entry.read_text("utf-8"))
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in found:
                raise ValueError(f"query {name!r} is defined twice (in {entry.name})")
            found[name] = body.strip().rstrip(";")
    return found


def query(name: str) -> str:
    """One named query; a missing name is a programming error."""
    return queries()[name]


@cache
def migrations() -> tuple[Migration, ...]:
    """The numbered migrations in `sql/`, in order."""
    found = []
    for entry in resources.files("contextlog.schema").joinpath("sql").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text("utf-8")))
    return tuple(sorted(found, key=lambda m: m.version))
