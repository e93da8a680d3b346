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
        """Read `CONTEXTLOG_ROLLING_WINDOW`, `_IDLE_TIMEOUT` (seconds), `_TOKEN_BUDGET`."""
        return cls(
            rolling_window=env_int(env, "CONTEXTLOG_ROLLING_WINDOW", ROLLING_WINDOW, 1),
            idle_timeout=env_int(env, "CONTEXTLOG_IDLE_TIMEOUT", IDLE_TIMEOUT, 0),
            token_budget=env_int(env, "CONTEXTLOG_TOKEN_BUDGET", TOKEN_BUDGET, 1),
        )


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
