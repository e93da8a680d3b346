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


def whole(name: str, raw: str, lowest: int, highest: int | None = None) -> int:
    """The whole number a setting `name` holds, at least `lowest` (and at most `highest`):
    the one rule of every whole-number setting (`ConfigError` naming it otherwise)."""
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} is not a whole number: {raw!r}") from None
    if highest is not None and not lowest <= value <= highest:
        raise ConfigError(f"{name} must be between {lowest} and {highest}: {raw!r}")
    if value < lowest:
        raise ConfigError(f"{name} must be at least {lowest}: {raw!r}")
    return value


def env_int(env: Mapping[str, str], name: str, default: int, lowest: int) -> int:
    """A whole-number setting from `env`: `default` when unset or blank, else at least `lowest`."""
    raw = env.get(name, "").strip()
    return whole(name, raw, lowest) if raw else default


FOREVER: Final = -1  # a retention that keeps for ever (where a default would not)
RETENTION_VAR: Final = "CONTEXTLOG_RETENTION"


@dataclass(frozen=True)
class Keep:
    """How long an agent's data is kept, in seconds: the log after a conversation's last
    activity, saved sessions after they were saved. None: no rule here (the next one down
    applies); FOREVER: kept for ever."""

    log: int | None = None
    sessions: int | None = None


@dataclass(frozen=True)
class Retention:
    """The deployment's retention policy: a default for every agent and per-agent rules
    (a conversation may override both with `retention.v1`)."""

    default: Keep = Keep()
    agents: tuple[tuple[str, Keep], ...] = ()

    def for_agent(self, agent: str) -> Keep:
        """The rules of one agent, its own over the default."""
        own = dict(self.agents).get(agent, Keep())
        return Keep(
            own.log if own.log is not None else self.default.log,
            own.sessions if own.sessions is not None else self.default.sessions,
        )

    @property
    def enforced(self) -> bool:
        """Whether any rule removes anything (else conversations' own overrides only)."""
        keeps = [self.default, *(k for _, k in self.agents)]
        return any(v is not None and v != FOREVER for k in keeps for v in (k.log, k.sessions))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Retention:
        """`CONTEXTLOG_KEEP_LOG` and `CONTEXTLOG_KEEP_SESSIONS` (durations such as 90d, or
        `forever`; unset: for ever) for every agent, and `CONTEXTLOG_RETENTION` for some:
        `support=log:30d,sessions:7d;legal=log:forever`."""
        default = Keep(
            _keep("CONTEXTLOG_KEEP_LOG", env.get("CONTEXTLOG_KEEP_LOG", "")),
            _keep("CONTEXTLOG_KEEP_SESSIONS", env.get("CONTEXTLOG_KEEP_SESSIONS", "")),
        )
        agents = []
        for entry in filter(None, (e.strip() for e in env.get(RETENTION_VAR, "").split(";"))):
            agent, sep, rules = entry.partition("=")
            if not sep or not agent.strip():
                raise ConfigError(
                    f"{RETENTION_VAR}: {entry!r} is not AGENT=log:DURATION,sessions:DURATION"
                )
            agents.append((agent.strip(), _rules(entry, rules)))
        return cls(default, tuple(agents))


def _rules(entry: str, rules: str) -> Keep:
    found: dict[str, int | None] = {}
    for rule in filter(None, (r.strip() for r in rules.split(","))):
        what, _, value = rule.partition(":")
        if what.strip() not in ("log", "sessions") or not value.strip():
            raise ConfigError(
                f"{RETENTION_VAR}: {rule!r} in {entry!r} is not log:DURATION or sessions:DURATION"
            )
        found[what.strip()] = _keep(f"{RETENTION_VAR} ({entry.strip()})", value)
    return Keep(found.get("log"), found.get("sessions"))


def _keep(name: str, raw: str) -> int | None:
    """A retention duration: None when blank, FOREVER for `forever`, else at least a day."""
    text = raw.strip().lower()
    if not text:
        return None
    if text in ("forever", "never"):
        return FOREVER
    try:
        value = parse_duration(text)
    except ValueError as e:
        raise ConfigError(f"{name} is {e} or `forever`") from None
    if value < 86_400:
        raise ConfigError(f"{name} must be at least a day (1d): {raw.strip()!r}")
    return value
