"""API keys: made and shown once by `contextlog keys create`, kept as a hash, scoped to agents
(and optionally channels) with rights.

A key reads `clk_<key id>_<secret>`. The key id finds the row; the secret's SHA-256 is
compared in constant time. The secret is 256 random bits, so a fast hash suffices: a slow
one (bcrypt, argon2) protects guessable passwords, and would cost every request.
Verified keys are trusted for `CONTEXTLOG_API_KEY_CACHE` seconds (default 5) before the
row is read again, which bounds how long a revoked key keeps working.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg.rows import class_row

from contextlog.schema.queries import query
from contextlog.worker.api.problems import ApiError

PREFIX: Final = "clk_"
RIGHTS: Final = ("post", "read", "sessions", "admin")
ANY: Final = "*"


@dataclass(frozen=True)
class ApiKey:
    """A key's row (its hash aside)."""

    key_id: str
    secret_hash: bytes
    name: str
    agents: list[str]
    channels: list[str] | None
    rights: list[str]
    created_at: dt.datetime
    revoked_at: dt.datetime | None

    def has(self, right: str) -> bool:
        """Whether the key carries `right` (`admin` carries every right)."""
        return right in self.rights or "admin" in self.rights

    def allows_agent(self, agent: str) -> bool:
        """Whether the key reaches some conversation of `agent`."""
        return ANY in self.agents or agent in self.agents

    def allows(self, agent: str, channel: str | None) -> bool:
        """Whether the key reaches (`agent`, `channel`); a channel-scoped key reaches no
        agent-wide listing (`channel` None)."""
        if not self.allows_agent(agent):
            return False
        if self.channels is None:
            return True
        return channel is not None and channel in self.channels

    def check(self, right: str, agent: str | None = None, channel: str | None = None) -> None:
        """Refuse (403) what this key may not do; `agent` None: a right only."""
        if not self.has(right):
            raise ApiError(
                403,
                "forbidden",
                f"this key lacks the {right!r} right (it has: {', '.join(self.rights)})",
            )
        if agent is not None and not self.allows(agent, channel):
            where = agent if channel is None else f"{agent}/{channel}"
            raise ApiError(403, "forbidden", f"this key is not scoped to {where}")


def _hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def new_token() -> tuple[str, str, bytes]:
    """A fresh key: (key id, the token to hand out, the hash to keep)."""
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return key_id, f"{PREFIX}{key_id}_{secret}", _hash(secret)


def parse_token(token: str) -> tuple[str, str]:
    """(key id, secret) of a token, or 401."""
    if not token.startswith(PREFIX) or token.count("_") < 2 or len(token) > 200:
        raise ApiError(401, "unauthorized", "the key is not a contextlog key (clk_...)")
    key_id, _, secret = token[len(PREFIX) :].partition("_")
    return key_id, secret


def matches(key: ApiKey, secret: str) -> bool:
    """Whether `secret` is this key's, in constant time."""
    return hmac.compare_digest(key.secret_hash, _hash(secret))


def check_scope(
    agents: Sequence[str], channels: Sequence[str] | None, rights: Sequence[str]
) -> None:
    """Refuse a key definition that could not work (ValueError with the reason)."""
    if not agents:
        raise ValueError("a key needs at least one agent (or '*' for every agent)")
    bad = sorted(set(rights) - set(RIGHTS))
    if bad or not rights:
        raise ValueError(f"rights must be some of {', '.join(RIGHTS)}; got {', '.join(rights)}")
    for name in [*agents, *(channels or [])]:
        if not name or len(name) > 200 or not name.isprintable():
            raise ValueError(f"not an agent or channel name: {name!r}")


def create(
    conn: psycopg.Connection[Any],
    name: str,
    agents: Sequence[str],
    channels: Sequence[str] | None,
    rights: Sequence[str],
) -> str:
    """Store a new key; returns its token, which is not kept anywhere."""
    check_scope(agents, channels, rights)
    key_id, token, digest = new_token()
    params = {
        "key_id": key_id,
        "secret_hash": digest,
        "name": name,
        "agents": list(agents),
        "channels": list(channels) if channels else None,
        "rights": sorted(set(rights)),
    }
    with conn.transaction():
        conn.execute(query("insert_api_key"), params)
    return token


def listed(conn: psycopg.Connection[Any]) -> list[ApiKey]:
    """Every key, revoked ones too, oldest first."""
    with conn.cursor(row_factory=class_row(ApiKey)) as cur:
        return cur.execute(query("list_api_keys")).fetchall()


def revoke(conn: psycopg.Connection[Any], key_id: str) -> bool:
    """Revoke a key (for good); False if there is none by that id."""
    with conn.transaction():
        row = conn.execute(query("revoke_api_key"), {"key_id": key_id}).fetchone()
    return row is not None


class Keys:
    """Verifies request keys against Postgres, trusting a verified key for `ttl` seconds."""

    def __init__(
        self, connect: Callable[[], Any], ttl: float, monotonic: Callable[[], float]
    ) -> None:
        self.connect = connect  # an async pool's `connection` (a context manager)
        self.ttl = ttl
        self.monotonic = monotonic
        self._cache: dict[str, tuple[float, ApiKey]] = {}

    async def verify(self, authorization: str | None) -> ApiKey:
        """The key of an `Authorization: Bearer clk_...` header, or 401."""
        if not authorization or not authorization.lower().startswith("bearer "):
            raise ApiError(401, "unauthorized", "send an API key: Authorization: Bearer clk_...")
        key_id, secret = parse_token(authorization[7:].strip())
        now = self.monotonic()
        cached = self._cache.get(key_id)
        key = cached[1] if cached and now - cached[0] < self.ttl else await self._load(key_id)
        if key is None or not matches(key, secret):
            raise ApiError(401, "unauthorized", "unknown API key")
        if key.revoked_at is not None:
            raise ApiError(401, "unauthorized", "this API key was revoked")
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[key_id] = (now, key)
        return key

    async def _load(self, key_id: str) -> ApiKey | None:
        async with self.connect() as conn, conn.cursor(row_factory=class_row(ApiKey)) as cur:
            await cur.execute(query("get_api_key"), {"key_id": key_id})
            row: ApiKey | None = await cur.fetchone()
            return row
