"""Deployment-wide defaults of the per-conversation settings (changed per conversation
by the configure command), shared by the reader and the workers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from contextlog.schema.errors import ConfigError

ROLLING_WINDOW: Final = 86_400
IDLE_TIMEOUT: Final = 1_800
TOKEN_BUDGET: Final = 16_000
# Reads from a streaming replica (producers/replica.py), in seconds: how far behind it may
# be for reads without wait_for, and how long a wait_for read waits for it to replay.
REPLICA_MAX_LAG: Final = 5.0
REPLICA_WAIT: Final = 0.25


@dataclass(frozen=True)
class ConversationDefaults:
    """Settings a conversation has until it configures its own."""

    rolling_window: int = ROLLING_WINDOW
    idle_timeout: int = IDLE_TIMEOUT
    token_budget: int = TOKEN_BUDGET

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ConversationDefaults:
        """Read `CONTEXTLOG_ROLLING_WINDOW`, `_IDLE_TIMEOUT` (durations: `1800`, `30m`,
        `24h`, as the CLI and the chat commands take them) and `_TOKEN_BUDGET`."""
        return cls(
            rolling_window=env_seconds(env, "CONTEXTLOG_ROLLING_WINDOW", ROLLING_WINDOW, 1),
            idle_timeout=env_seconds(env, "CONTEXTLOG_IDLE_TIMEOUT", IDLE_TIMEOUT, 0),
            token_budget=env_int(env, "CONTEXTLOG_TOKEN_BUDGET", TOKEN_BUDGET, 1),
        )


_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """Seconds in `90`, `90s`, `10m`, `24h` or `7d`; raises ValueError with the reason."""
    raw = text.strip().lower()
    unit = raw[-1:] if raw[-1:] in _UNITS else "s"
    number = raw[:-1] if raw[-1:] in _UNITS else raw
    if not number.isdigit():
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 10m, 24h, 7d)")
    return int(number) * _UNITS[unit]


def env_seconds(env: Mapping[str, str], name: str, default: int, lowest: int) -> int:
    """A duration setting from `env` (`parse_duration`): `default` when unset or blank,
    else at least `lowest` seconds."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = parse_duration(raw)
    except ValueError as e:
        raise ConfigError(f"{name} is {e}") from None
    if value < lowest:
        raise ConfigError(f"{name} must be at least {lowest} seconds: {raw!r}")
    return value


def env_int(env: Mapping[str, str], name: str, default: int, lowest: int) -> int:
    """A whole-number setting from `env`: `default` when unset or blank, else at least `lowest`."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} is not a whole number: {raw!r}") from None
    if value < lowest:
        raise ConfigError(f"{name} must be at least {lowest}: {raw!r}")
    return value
