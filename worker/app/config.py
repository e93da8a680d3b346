"""Settings: read from the environment in this one place and validated at start-up."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar
from urllib.parse import parse_qs, urlsplit

from contextlog.producers import connection
from contextlog.producers.connection import redact
from contextlog.schema import codec, keys, signing
from contextlog.schema.defaults import (
    REPLICA_MAX_LAG,
    REPLICA_WAIT,
    ConversationDefaults,
    Retention,
    whole,
)
from contextlog.schema.errors import ConfigError

DEFAULT_REDIS_URL: Final = "redis://127.0.0.1:6379/0"
DEFAULT_DATABASE_URL: Final = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_BATCH_SIZE: Final = 2000
# A shard's batch grows by further reads of `batch_size` entries while it holds fewer
# bytes than this: ~6,000 entries of ~400 B, where larger transactions cost Postgres
# less an event; a batch's memory stays within this plus one read.
DEFAULT_BATCH_BYTES: Final = 2 << 20
# One thread (and Postgres connection) per shard of the default count: each owned shard is
# stored while the others are read, decoded and formatted (a thread waiting on Postgres
# releases the GIL).
DEFAULT_INGEST_THREADS: Final = 4
DEFAULT_MAX_DELIVERIES: Final = 10
DEFAULT_LEASE_SECONDS: Final = 15.0
DEFAULT_BLOCK_MS: Final = 500
DEFAULT_TRIM_SECONDS: Final = 5.0
DEFAULT_BACKOFF_MAX: Final = 10.0
DEFAULT_SUMMARY_MODEL: Final = "claude-haiku-4-5"
DEFAULT_SUMMARY_ATTEMPTS: Final = 4
DEFAULT_SUMMARY_TIMEOUT: Final = 30.0
DEFAULT_SWEEP_SECONDS: Final = 300.0
# Conversations one retention step drops (and tells to expire sessions) at most; the
# rest wait for the next sweep.
DEFAULT_RETENTION_BATCH: Final = 200
DEFAULT_DASHBOARD_BIND: Final = "127.0.0.1"
# Seconds a process (ingest, worker) may take to stop after SIGTERM before it exits at once
# (worker.app.signals): under the 10 s most supervisors wait before their SIGKILL.
DEFAULT_STOP_GRACE: Final = 8.0
DEFAULT_DASHBOARD_PORT: Final = 9181
# `contextlog api`: where it listens, what one request may carry, how often a key may ask.
DEFAULT_API_BIND: Final = "127.0.0.1"
DEFAULT_API_PORT: Final = 8420
DEFAULT_API_MAX_BODY: Final = 1 << 20  # a batch of a few entries at the 256 KiB entry cap
DEFAULT_API_MAX_IMPORT: Final = 16 << 20  # a session export, attachments inline
DEFAULT_API_RATE: Final = 50.0  # requests a second, per key, per api process
DEFAULT_API_BURST: Final = 100
DEFAULT_API_KEY_CACHE: Final = 5.0  # seconds a verified key is trusted before a re-read
DEFAULT_WEBHOOK_TIMEOUT: Final = 10.0
DEFAULT_WEBHOOK_ATTEMPTS: Final = 8
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
# `auto`: the console form when stderr is a terminal, JSON lines otherwise (files, pipes,
# a log collector).
LOG_FORMATS: Final = ("auto", "json", "console")

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Deployment settings of every contextlog process."""

    redis_url: str = DEFAULT_REDIS_URL
    # RQ's queues, scheduler, idle timers and compaction claims: RQ cannot use a Redis
    # Cluster, so with REDIS_URL on a cluster these live on a standalone Redis.
    queue_redis_url: str = DEFAULT_REDIS_URL
    database_url: str = DEFAULT_DATABASE_URL
    # Context readers built here (CLI, chat, demo) read from this streaming replica.
    replica_url: str | None = None
    replica_max_lag: float = REPLICA_MAX_LAG
    replica_wait: float = REPLICA_WAIT
    shards: int = keys.DEFAULT_SHARDS
    batch_size: int = DEFAULT_BATCH_SIZE
    batch_bytes: int = DEFAULT_BATCH_BYTES
    ingest_threads: int = DEFAULT_INGEST_THREADS
    max_entry_bytes: int = codec.DEFAULT_MAX_ENTRY_BYTES
    max_deliveries: int = DEFAULT_MAX_DELIVERIES
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    block_ms: int = DEFAULT_BLOCK_MS
    trim_seconds: float = DEFAULT_TRIM_SECONDS
    backoff_max: float = DEFAULT_BACKOFF_MAX
    consumer: str = ""
    log_level: str = "info"
    log_format: str = "auto"
    # Console lines without a time of their own, for a supervisor that stamps each line
    # (honcho under `make run`); JSON lines always carry theirs.
    log_timestamps: bool = True
    conversation: ConversationDefaults = dataclasses.field(default_factory=ConversationDefaults)
    # Summaries: without an API key a local, deterministic summarizer is used.
    anthropic_api_key: str | None = dataclasses.field(default=None, repr=False)
    # Signs the results only workers emit (schema/signing.py); None: a key kept in Postgres.
    signing_key: str | None = dataclasses.field(default=None, repr=False)
    anthropic_base_url: str | None = None
    summary_model: str = DEFAULT_SUMMARY_MODEL
    summary_attempts: int = DEFAULT_SUMMARY_ATTEMPTS
    summary_timeout: float = DEFAULT_SUMMARY_TIMEOUT
    sweep_seconds: float = DEFAULT_SWEEP_SECONDS
    retention: Retention = dataclasses.field(default_factory=Retention)
    retention_batch: int = DEFAULT_RETENTION_BATCH
    # Where the retention step archives a conversation before dropping it (`contextlog
    # retire`'s files); None: dropped without an archive.
    retention_archive: str | None = None
    dashboard_bind: str = DEFAULT_DASHBOARD_BIND
    dashboard_port: int = DEFAULT_DASHBOARD_PORT
    dashboard_user: str | None = None
    dashboard_password: str | None = dataclasses.field(default=None, repr=False)
    api_bind: str = DEFAULT_API_BIND
    api_port: int = DEFAULT_API_PORT
    api_max_body: int = DEFAULT_API_MAX_BODY
    api_max_import: int = DEFAULT_API_MAX_IMPORT
    api_rate: float = DEFAULT_API_RATE
    api_burst: int = DEFAULT_API_BURST
    api_key_cache: float = DEFAULT_API_KEY_CACHE
    # Webhook targets: host names allowed (empty: any), and whether addresses on loopback,
    # private or link-local networks may be targets (not by default).
    webhook_hosts: tuple[str, ...] = ()
    webhook_allow_private: bool = False
    webhook_timeout: float = DEFAULT_WEBHOOK_TIMEOUT
    webhook_attempts: int = DEFAULT_WEBHOOK_ATTEMPTS
    stop_grace: float = DEFAULT_STOP_GRACE
    # The operator accepts that a Redis that may evict keys loses events (memory.py).
    accept_eviction: bool = False
    # `contextlog acl`: each Redis user's password (CONTEXTLOG_REDIS_PASSWORD_<ROLE>), by
    # variable; only their hashes are printed.
    redis_passwords: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from `env` (default: the process environment)."""
        env = os.environ if env is None else env
        _refuse_empty_servers(env)
        r = _Reader(env)
        redis_url = r.get("REDIS_URL", DEFAULT_REDIS_URL, _redis_url)
        return cls(
            redis_url=redis_url,
            queue_redis_url=_queue_redis_url(r, redis_url),
            database_url=r.get("DATABASE_URL", DEFAULT_DATABASE_URL, _database_url),
            replica_url=r.get("CONTEXTLOG_REPLICA_URL", None, _database_url),
            replica_max_lag=r.get(
                "CONTEXTLOG_REPLICA_MAX_LAG", REPLICA_MAX_LAG, _float_in(0, 86400)
            ),
            replica_wait=r.get("CONTEXTLOG_REPLICA_WAIT", REPLICA_WAIT, _float_in(0, 60)),
            shards=keys.shards_from_env(env),
            batch_size=r.get("CONTEXTLOG_BATCH_SIZE", DEFAULT_BATCH_SIZE, _int_in(1, 10_000)),
            batch_bytes=r.get("CONTEXTLOG_BATCH_BYTES", DEFAULT_BATCH_BYTES, _int_in(1, 256 << 20)),
            ingest_threads=r.get(
                "CONTEXTLOG_INGEST_THREADS", DEFAULT_INGEST_THREADS, _int_in(1, 64)
            ),
            max_entry_bytes=r.get(
                "CONTEXTLOG_MAX_ENTRY_BYTES", codec.DEFAULT_MAX_ENTRY_BYTES, _int_in(1024, 64 << 20)
            ),
            max_deliveries=r.get(
                "CONTEXTLOG_MAX_DELIVERIES", DEFAULT_MAX_DELIVERIES, _int_in(1, 1000)
            ),
            lease_seconds=r.get(
                "CONTEXTLOG_LEASE_SECONDS", DEFAULT_LEASE_SECONDS, _float_in(0.5, 3600)
            ),
            block_ms=r.get("CONTEXTLOG_BLOCK_MS", DEFAULT_BLOCK_MS, _int_in(1, 60_000)),
            trim_seconds=r.get(
                "CONTEXTLOG_TRIM_SECONDS", DEFAULT_TRIM_SECONDS, _float_in(0, 86400)
            ),
            backoff_max=r.get("CONTEXTLOG_BACKOFF_MAX", DEFAULT_BACKOFF_MAX, _float_in(0.01, 600)),
            consumer=r.get("CONTEXTLOG_CONSUMER", default_consumer(), _name),
            log_level=r.get("CONTEXTLOG_LOG_LEVEL", "info", _choice(LOG_LEVELS)),
            log_format=r.get("CONTEXTLOG_LOG_FORMAT", "auto", _choice(LOG_FORMATS)),
            log_timestamps=r.get("CONTEXTLOG_LOG_TIMESTAMPS", True, _flag),
            conversation=ConversationDefaults.from_env(env),
            anthropic_api_key=r.get("ANTHROPIC_API_KEY", None, _secret),
            signing_key=r.get("CONTEXTLOG_SIGNING_KEY", None, _signing_key),
            anthropic_base_url=r.get("ANTHROPIC_BASE_URL", None, _http_url),
            summary_model=r.get("CONTEXTLOG_SUMMARY_MODEL", DEFAULT_SUMMARY_MODEL, _name),
            summary_attempts=r.get(
                "CONTEXTLOG_SUMMARY_ATTEMPTS", DEFAULT_SUMMARY_ATTEMPTS, _int_in(1, 20)
            ),
            summary_timeout=r.get(
                "CONTEXTLOG_SUMMARY_TIMEOUT", DEFAULT_SUMMARY_TIMEOUT, _float_in(0.1, 600)
            ),
            sweep_seconds=r.get(
                "CONTEXTLOG_SWEEP_SECONDS", DEFAULT_SWEEP_SECONDS, _float_in(1, 86400)
            ),
            retention=Retention.from_env(env),
            retention_batch=r.get(
                "CONTEXTLOG_RETENTION_BATCH", DEFAULT_RETENTION_BATCH, _int_in(1, 100_000)
            ),
            retention_archive=r.get("CONTEXTLOG_RETENTION_ARCHIVE", None, _directory),
            dashboard_bind=r.get("CONTEXTLOG_DASHBOARD_BIND", DEFAULT_DASHBOARD_BIND, _name),
            dashboard_port=r.get(
                "CONTEXTLOG_DASHBOARD_PORT", DEFAULT_DASHBOARD_PORT, _int_in(1, 65535)
            ),
            dashboard_user=r.get("CONTEXTLOG_DASHBOARD_USER", None, _name),
            dashboard_password=r.get("CONTEXTLOG_DASHBOARD_PASSWORD", None, _secret),
            **_api_settings(r),
            stop_grace=r.get("CONTEXTLOG_STOP_GRACE", DEFAULT_STOP_GRACE, _float_in(0.5, 3600)),
            accept_eviction=r.get(ACCEPT_EVICTION_VAR, False, _flag),
            redis_passwords=_redis_passwords(env),
        )

    def reader_options(self) -> dict[str, Any]:
        """Keyword arguments of `ContextReader.from_url` for these settings."""
        return {
            "defaults": self.conversation,
            "replica_url": self.replica_url,
            "max_replica_lag": self.replica_max_lag,
            "replica_wait": self.replica_wait,
        }


NO_HOSTS: tuple[str, ...] = ()


def _api_settings(r: _Reader) -> dict[str, Any]:
    """The settings of `contextlog api` and of webhook deliveries."""
    return {
        "api_bind": r.get("CONTEXTLOG_API_BIND", DEFAULT_API_BIND, _name),
        "api_port": r.get("CONTEXTLOG_API_PORT", DEFAULT_API_PORT, _int_in(1, 65535)),
        "api_max_body": r.get(
            "CONTEXTLOG_API_MAX_BODY", DEFAULT_API_MAX_BODY, _int_in(1024, 1 << 30)
        ),
        "api_max_import": r.get(
            "CONTEXTLOG_API_MAX_IMPORT", DEFAULT_API_MAX_IMPORT, _int_in(1024, 1 << 30)
        ),
        "api_rate": r.get("CONTEXTLOG_API_RATE", DEFAULT_API_RATE, _float_in(0.01, 1e6)),
        "api_burst": r.get("CONTEXTLOG_API_BURST", DEFAULT_API_BURST, _int_in(1, 1_000_000)),
        "api_key_cache": r.get(
            "CONTEXTLOG_API_KEY_CACHE", DEFAULT_API_KEY_CACHE, _float_in(0, 3600)
        ),
        "webhook_hosts": r.get("CONTEXTLOG_WEBHOOK_HOSTS", NO_HOSTS, _hosts),
        "webhook_allow_private": r.get("CONTEXTLOG_WEBHOOK_ALLOW_PRIVATE", False, _bool),
        "webhook_timeout": r.get(
            "CONTEXTLOG_WEBHOOK_TIMEOUT", DEFAULT_WEBHOOK_TIMEOUT, _float_in(0.1, 300)
        ),
        "webhook_attempts": r.get(
            "CONTEXTLOG_WEBHOOK_ATTEMPTS", DEFAULT_WEBHOOK_ATTEMPTS, _int_in(1, 20)
        ),
    }


REDIS_PASSWORD_PREFIX: Final = "CONTEXTLOG_REDIS_PASSWORD_"


def _redis_passwords(env: Mapping[str, str]) -> dict[str, str]:
    """The `CONTEXTLOG_REDIS_PASSWORD_*` variables that are set, checked as secrets."""
    return {
        name: _secret(name, raw.strip())
        for name, raw in env.items()
        if name.startswith(REDIS_PASSWORD_PREFIX) and raw.strip()
    }


def _hosts(name: str, raw: str) -> tuple[str, ...]:
    """Comma-separated host names; `*.example.com` allows its subdomains."""
    hosts = tuple(h.strip().lower() for h in raw.split(",") if h.strip())
    for h in hosts:
        if not h.isprintable() or " " in h or "/" in h or ":" in h:
            raise ConfigError(
                f"{name} holds {h!r}, which is not a host name (e.g. hooks.example.com)"
            )
    return hosts


def _bool(name: str, raw: str) -> bool:
    value = raw.lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ConfigError(f"{name} must be true or false: {raw!r}")
    return value in ("true", "1", "yes")


def default_consumer() -> str:
    """A consumer name unique to this process: host and pid."""
    return f"{socket.gethostname()}-{os.getpid()}"


# Variables whose default is a server: set but empty (`REDIS_URL=` in a shell or an .env
# file) is a mistake to point out, not a quiet switch to the default server.
_SERVER_VARIABLES: Final = {
    "REDIS_URL": DEFAULT_REDIS_URL,
    "DATABASE_URL": DEFAULT_DATABASE_URL,
    "CONTEXTLOG_QUEUE_REDIS_URL": "REDIS_URL",
}


def _refuse_empty_servers(env: Mapping[str, str]) -> None:
    for name, default in _SERVER_VARIABLES.items():
        if name in env and not env[name].strip():
            raise ConfigError(
                f"{name} is set but empty: give a URL, or unset it for the default ({default})"
            )


class _Reader:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def get(self, name: str, default: T, parse: Callable[[str, str], T]) -> T:
        raw = self.env.get(name)
        if raw is None or raw.strip() == "":
            return default
        return parse(name, raw.strip())


QUEUE_REDIS_VAR: Final = "CONTEXTLOG_QUEUE_REDIS_URL"
ACCEPT_EVICTION_VAR: Final = "CONTEXTLOG_ACCEPT_EVICTION"


def _queue_redis_url(r: _Reader, redis_url: str) -> str:
    """CONTEXTLOG_QUEUE_REDIS_URL, by default REDIS_URL; never a cluster (RQ needs MULTI
    and Lua over keys of many slots)."""
    queue = r.get(QUEUE_REDIS_VAR, redis_url, _standalone_redis_url)
    if connection.is_cluster_url(queue):
        raise ConfigError(
            f"REDIS_URL is a Redis Cluster, which RQ cannot use for its queues, scheduler "
            f"and idle timers: set {QUEUE_REDIS_VAR} to a standalone Redis: {redact(redis_url)!r}"
        )
    return queue


def _standalone_redis_url(name: str, raw: str) -> str:
    if connection.is_cluster_url(raw):
        raise ConfigError(
            f"{name} must be a standalone Redis (RQ cannot use a cluster): {redact(raw)!r}"
        )
    return _redis_url(name, raw)


def _redis_url(name: str, raw: str) -> str:
    """A URL redis-py reads as written: it quietly takes database 0 for a database it
    cannot parse (`/99x`), and every process must honour the number given. A Redis
    Cluster (`redis+cluster://`) has database 0 only."""
    if connection.is_cluster_url(raw):
        _redis_url(name, connection.cluster_node_url(raw, name))  # database 0 only
        return raw
    parts = urlsplit(raw)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(
            f"{name} is not a redis://, redis+cluster:// or unix:// URL: {redact(raw)!r}"
        )
    try:
        parts.port  # noqa: B018 - parsing it is the check
    except ValueError:
        raise ConfigError(f"{name} has a port that is not a number: {redact(raw)!r}") from None
    dbs = parse_qs(parts.query).get("db", [])
    if parts.scheme != "unix" and parts.path.strip("/"):
        dbs.append(parts.path.strip("/"))
    for db in dbs:
        if not (db.isdigit() and db.isascii()):
            raise ConfigError(
                f"{name} names database {db!r}, which is not a number "
                f"(use e.g. redis://host:6379/13): {redact(raw)!r}"
            )
    return raw


def _database_url(name: str, raw: str) -> str:
    if urlsplit(raw).scheme not in ("postgresql", "postgres"):
        raise ConfigError(f"{name} is not a postgresql:// URL: {redact(raw)!r}")
    return raw


def _directory(name: str, raw: str) -> str:
    if not os.path.isdir(raw):
        raise ConfigError(f"{name} is not an existing directory: {raw!r}")
    return raw


def _secret(name: str, raw: str) -> str:
    if not raw.isprintable() or " " in raw:
        # The value itself is never echoed: it is a secret.
        raise ConfigError(f"{name} holds spaces or control characters; check how it was set")
    return raw


def _signing_key(name: str, raw: str) -> str:
    value = _secret(name, raw)
    if len(value.encode()) < signing.MIN_KEY_BYTES:
        raise ConfigError(f"{name} must hold at least {signing.MIN_KEY_BYTES} characters")
    return value


def _http_url(name: str, raw: str) -> str:
    if urlsplit(raw).scheme not in ("http", "https"):
        raise ConfigError(f"{name} is not an http:// or https:// URL: {redact(raw)!r}")
    return raw


def _int_in(lo: int, hi: int) -> Callable[[str, str], int]:
    return lambda name, raw: whole(name, raw, lo, hi)


def _float_in(lo: float, hi: float) -> Callable[[str, str], float]:
    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{name} is not a number: {raw!r}") from None
        if not lo <= value <= hi:
            raise ConfigError(f"{name} must be between {lo} and {hi}: {raw!r}")
        return value

    return parse


def _choice(options: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        if raw.lower() not in options:
            raise ConfigError(f"{name} must be one of {', '.join(options)}: {raw!r}")
        return raw.lower()

    return parse


_FLAGS: Final = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def _flag(name: str, raw: str) -> bool:
    value = _FLAGS.get(raw.lower())
    if value is None:
        raise ConfigError(f"{name} must be 1 or 0 (true/false, yes/no): {raw!r}")
    return value


def _name(name: str, raw: str) -> str:
    if len(raw) > 200 or not raw.isprintable():
        raise ConfigError(f"{name} must be a printable name of at most 200 characters: {raw!r}")
    return raw
