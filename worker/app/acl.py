"""Redis ACL rules per role: the commands each contextlog process sends, on the keys it uses.

Each role is a Redis user made of grants. A grant is a Redis 7 *selector*: commands
allowed on keys matching its patterns (and pubsub channels), so a role can XADD to the
inbound streams without reading them, and consume its own notification stream without
touching another's. Key-less commands (PING, MULTI, INFO ...) sit at the user's root.
The lists were found by running each process as its own user (tests/e2e/test_acl.py
checks that the happy path leaves `ACL LOG` empty), completed from the code paths that
path does not reach (RQ's from its source).

Per-role users need Redis 7.0 or newer: key permissions `%R~`/`%W~` and selectors came
with 7.0. An adapter's user, for instance (`contextlog acl adapter --source discord`):

    ACL SETUSER contextlog-adapter-discord reset on #<sha256> +ping +select +multi ...
        (%W~contextlog:in:{*} +xadd) (~contextlog:in:{*} +eval)
        (%W~contextlog:attachment:{*}:* +set) (%R~contextlog:shards +get)
        (~contextlog:out:{discord} +xreadgroup +xack +xgroup|create +xpending ...)
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from contextlog.schema import keys
from contextlog.worker.app.config import REDIS_PASSWORD_PREFIX

# Key patterns (Redis glob patterns: braces are literal, `*` any text). Each is checked
# against the key functions that name the real keys in tests/unit/test_acl.py.
INBOUND: Final = "contextlog:in:{*}"
DEAD: Final = "contextlog:dead:{*}"
STATS: Final = "contextlog:stats:{*}"
LEASE: Final = "contextlog:lease:{*}"
EPOCH: Final = "contextlog:epoch:{*}"
INFLIGHT: Final = "contextlog:inflight:{*}"
SHARDS: Final = "contextlog:shards"
INGEST_SETS: Final = "contextlog:ingest:*"  # members and run notes
ATTACHMENTS: Final = "contextlog:attachment:{*}:*"
OUTBOXES: Final = "contextlog:out:{*}"
TIMERS: Final = "contextlog:idle:{*}"
BUCKETS: Final = "contextlog:idle-due:{*}"
CLAIMS: Final = "contextlog:compacting:{*}"
HEARTBEATS: Final = "contextlog:worker:{*}:sweep"
EVERY_CONTEXTLOG_KEY: Final = "contextlog:*"
RQ_KEYS: Final = "rq:*"
RQ_CHANNELS: Final = "rq:pubsub:*"  # a worker's command channel (shutdown, kill-horse)

# What every client sends: redis-py's health checks, SELECT of REDIS_URL's database,
# pipelines in MULTI. AUTH and HELLO need no rule.
CONNECTION: Final = ("ping", "select", "multi", "exec", "discard")
# redis-py names itself on connect (CLIENT SETINFO, 7.2+; refused quietly without it,
# but each refusal lands in ACL LOG). Redis 7.0 refuses the rule itself.
SETINFO: Final = "client|setinfo"
SETINFO_SINCE: Final = (7, 2)
OLDEST: Final = (7, 0)

# Everything rq 3.0 sends (queues, jobs, registries, results, its scripts), from its
# source: enqueueing, the dashboard's views and actions, and the worker's loop all
# share these keys, and a path a test misses must not fail in production.
RQ_COMMANDS: Final = (
    "get", "set", "del", "exists", "expire", "persist", "ttl", "pttl", "rename",
    "hset", "hget", "hgetall", "hmget", "hexists", "hincrby", "hincrbyfloat",
    "sadd", "srem", "smembers", "scard",
    "zadd", "zrem", "zcard", "zcount", "zrange", "zrangebyscore", "zscore",
    "zremrangebyscore", "zremrangebyrank", "zpopmin",
    "lpush", "rpush", "lpop", "lrem", "lrange", "llen", "lpos", "lmove", "blpop", "blmove",
    "xadd", "xread", "xrevrange", "xlen",
    "watch", "unwatch", "eval", "evalsha",
)  # fmt: skip
# A consumer group on a notification stream (producers.Notifications).
CONSUMER: Final = ("xreadgroup", "xack", "xgroup|create", "xpending")
# Loading scripts (redis-py's registered scripts: EVALSHA, SCRIPT LOAD when missing).
SCRIPTS: Final = ("script|load", "script|exists")

SOURCE_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
PREFIX_NAME: Final = re.compile(r"^[A-Za-z0-9_.:-]{0,64}$")


@dataclass(frozen=True)
class Grant:
    """Commands allowed on keys matching `keys` (ACL key rules: `~p` read and write,
    `%R~p` read, `%W~p` write) and on pubsub `channels`; why, in `what`."""

    what: str
    commands: tuple[str, ...]
    keys: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()

    def selector(self) -> str:
        """The grant as a Redis selector: `(%W~contextlog:in:{*} +xadd)`."""
        rules = [*self.keys, *(f"&{c}" for c in self.channels)]
        return "(" + " ".join([*rules, *(f"+{c}" for c in self.commands)]) + ")"


@dataclass(frozen=True)
class Role:
    """A Redis user: key-less commands at its root, one selector per keyed grant."""

    name: str  # the user name's suffix: `ingest`, `adapter-discord`
    root: tuple[str, ...]
    grants: tuple[Grant, ...]

    @property
    def password_var(self) -> str:
        """The variable holding this user's password: CONTEXTLOG_REDIS_PASSWORD_INGEST."""
        return REDIS_PASSWORD_PREFIX + self.name.upper().replace("-", "_")


def rq(what: str) -> Grant:
    """RQ's keys, every command RQ sends."""
    return Grant(what, RQ_COMMANDS, (f"~{RQ_KEYS}",))


PUSH: Final = Grant("push entries to any shard: write only", ("xadd",), (f"%W~{INBOUND}",))
PUSH_SCRIPT: Final = Grant(
    "push 4+ entries of a stream in one EVAL; EVAL asks read and write on its keys, and "
    "the XADDs the script runs are checked again (no read is granted anywhere)",
    ("eval",),
    (f"~{INBOUND}",),
)
ATTACH: Final = Grant("store attachment bytes beside their entry", ("set",), (f"%W~{ATTACHMENTS}",))
READ_SHARDS: Final = Grant("the shard count ingest recorded", ("get",), (f"%R~{SHARDS}",))
IDLE_TIMERS: Final = Grant(
    "idle timers and their due-second buckets (scripts)",
    ("evalsha", "hget", "hset", "hmget", "hkeys", "pexpire", "pttl", "del"),
    (f"~{TIMERS}", f"~{BUCKETS}"),
)
COMPACTION_CLAIMS: Final = Grant(
    "claim a conversation's compaction (script), let it settle after",
    ("evalsha", "set", "expire"),
    (f"~{CLAIMS}",),
)


def adapter(source: str) -> Role:
    """An adapter (a bot, `producers`): pushes for any conversation, reads nothing but
    the shard count and its own notifications."""
    check_source(source)
    own = Grant(
        f"its own notifications ({source}) as a consumer group; XREAD and XREVRANGE: "
        "`contextlog send --wait` waits for its answer so",
        (*CONSUMER, "xread", "xrevrange"),
        (f"~{keys.outbox(source)}",),  # literal: no pattern character passes check_source
    )
    return Role(f"adapter-{source}", (), (PUSH, PUSH_SCRIPT, ATTACH, READ_SHARDS, own))


# Ingest: its streams as the `ingest` group (reads, claims after a crash, trims), shard
# leases and epochs (scripts), dead letters and their counters (one MULTI), membership,
# run notes and outage notes, attachments waiting for it, notices to the adapters.
INGEST_COMMANDS: Final = (
    "xreadgroup", "xack", "xgroup|create", "xgroup|delconsumer", "xinfo|groups",
    "xinfo|consumers", "xpending", "xclaim", "xrange", "xtrim", "xadd", "hincrby", "hset", "hdel",
    "get", "set", "del", "mget", "incr", "pexpire",
    "zadd", "zcard", "zrem", "zremrangebyscore", "zrangebyscore", "eval", "evalsha",
)  # fmt: skip
INGEST_PATTERNS: Final = (
    INBOUND, DEAD, STATS, LEASE, EPOCH, INFLIGHT, SHARDS, INGEST_SETS, ATTACHMENTS, OUTBOXES,
)  # fmt: skip
# What `contextlog status` and /v1/status read.
STATUS_COMMANDS: Final = (
    "get", "hgetall", "xlen", "xinfo|groups", "xinfo|stream", "xpending", "xrange",
    "zcount", "zrangebyscore",
)  # fmt: skip

INGEST: Final = Role(
    "ingest",
    ("info", *SCRIPTS),
    (
        Grant(
            "the streams, leases, dead letters, notices",
            INGEST_COMMANDS,
            tuple(f"~{p}" for p in INGEST_PATTERNS),
        ),
        IDLE_TIMERS,
        COMPACTION_CLAIMS,
        rq("queue summaries, compactions and idle checks"),
    ),
)

WORKER: Final = Role(
    "worker",
    ("info", "scan", "client|setname", "client|info", *SCRIPTS),
    (
        PUSH,
        READ_SHARDS,
        Grant("follow every notification stream for webhooks", CONSUMER, (f"~{OUTBOXES}",)),
        Grant(
            "the sweeper's heartbeat",
            ("hset", "hdel", "hgetall", "expire", "del"),
            (f"~{HEARTBEATS}",),
        ),
        IDLE_TIMERS,
        COMPACTION_CLAIMS,
        rq("RQ's worker and scheduler"),
        Grant(
            "RQ's command channel of each worker",
            ("subscribe", "unsubscribe"),
            channels=(RQ_CHANNELS,),
        ),
    ),
)

API: Final = Role(
    "api",
    ("info", *SCRIPTS),
    (
        PUSH,
        PUSH_SCRIPT,
        ATTACH,
        READ_SHARDS,
        Grant("every source's notifications, for server-sent events", CONSUMER, (f"~{OUTBOXES}",)),
        Grant(
            "what /v1/status reads (as `contextlog status`): read only",
            STATUS_COMMANDS,
            (f"%R~{EVERY_CONTEXTLOG_KEY}",),
        ),
        rq("status reads the queues; webhook replays enqueue"),
    ),
)

DASHBOARD: Final = Role(
    "dashboard",
    ("info", *SCRIPTS),
    (rq("rq-dashboard's views and actions: requeue, delete, empty, compact"),),
)

FIXED: Final = {r.name: r for r in (INGEST, WORKER, API, DASHBOARD)}
NAMES: Final = ("adapter", *FIXED)


def roles(names: Sequence[str], sources: Sequence[str]) -> list[Role]:
    """The roles asked for (every one when none is), an adapter per source."""
    wanted = list(dict.fromkeys(names or NAMES))
    if "adapter" in names and not sources:
        raise ValueError("the adapter role needs --source NAME (one per adapter)")
    out = [adapter(s) for s in dict.fromkeys(sources)] if "adapter" in wanted else []
    return out + [FIXED[n] for n in wanted if n != "adapter"]


def check_role(text: str) -> str:
    """One of the role names."""
    if text not in NAMES:
        raise ValueError(f"no role {text!r}; roles: {', '.join(NAMES)}")
    return text


def check_source(text: str) -> str:
    """A source name usable in a user name and a key pattern, as it is."""
    if not SOURCE_NAME.match(text):
        raise ValueError(f"a source must be 1-64 letters, digits, '_' or '-': {text!r}")
    return text


def check_prefix(text: str) -> str:
    """A user name prefix without spaces or pattern characters."""
    if not PREFIX_NAME.match(text):
        raise ValueError(f"a user prefix is letters, digits and '_.:-' only: {text!r}")
    return text


def parse_version(text: str) -> tuple[int, int]:
    """`7`, `7.2` or `7.2.4` as (major, minor); older than 7.0 is refused."""
    parts = text.split(".")
    if not (1 <= len(parts) <= 3 and all(p.isdigit() for p in parts)):
        raise ValueError(f"not a Redis version like 7.2: {text!r}")
    version = (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0)
    if version < OLDEST:
        raise ValueError(
            f"per-role ACL users need Redis 7.0 or newer (key permissions %R~/%W~ and "
            f"selectors came with 7.0), not {text}: upgrade Redis, or run every process "
            "as one user"
        )
    return version


@dataclass(frozen=True)
class User:
    """One role rendered for a deployment: its user name and ACL rules."""

    name: str
    role: Role
    rules: tuple[str, ...]

    def setuser(self) -> str:
        """An `ACL SETUSER` command line (for redis-cli)."""
        return " ".join(("ACL", "SETUSER", self.name, *self.rules))

    def file_line(self) -> str:
        """A line of a Redis ACL file (`aclfile`)."""
        return " ".join(("user", self.name, *self.rules))


def password_hash(password: str) -> str:
    """How Redis stores a password (`#<sha256 hex>`): the rules never carry the secret."""
    return "#" + hashlib.sha256(password.encode()).hexdigest()


def user(
    role: Role, prefix: str, version: tuple[int, int], password: Callable[[str], str | None]
) -> User:
    """`role` as a user: reset first (a re-run replaces every rule), `on` with its
    password's hash when `password(role.password_var)` gives one, else `off`."""
    secret = password(role.password_var)
    state = ("on", password_hash(secret)) if secret else ("off",)
    base = (*CONNECTION, SETINFO) if version >= SETINFO_SINCE else CONNECTION
    root = tuple(f"+{c}" for c in (*base, *role.root))
    selectors = tuple(g.selector() for g in role.grants)
    return User(prefix + role.name, role, ("reset", *state, *root, *selectors))


def users(
    chosen: Sequence[Role],
    prefix: str,
    version: tuple[int, int],
    passwords: Mapping[str, str],
) -> list[User]:
    """Every chosen role as a user; two adapters may not share a password variable."""
    seen: dict[str, str] = {}
    for role in chosen:
        other = seen.setdefault(role.password_var, role.name)
        if other != role.name:
            raise ValueError(
                f"sources of {other} and {role.name} share {role.password_var}: "
                "name them apart by more than case or '-' against '_'"
            )
    return [user(r, prefix, version, passwords.get) for r in chosen]
