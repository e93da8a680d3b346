"""Every role of the Procfile as its own Redis ACL user: the rules `contextlog acl` prints,
loaded into a private Redis 7 (as an ACL file, and through redis-cli). The whole happy path
(ingest, worker and its scheduler, idle saves, summaries, compaction, attachments, the HTTP
API with its notifications and webhooks, rq-dashboard's views and actions, two adapters)
leaves ACL LOG empty; an adapter's user reads no other source's notifications, nothing of
ingest's or RQ's keys, and cannot get a result in: its forged compaction is dead-lettered."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from rq import Queue

from contextlog.producers import ContextReader, Producer
from contextlog.producers.ids import uuid7
from contextlog.producers.notifications import Notifications
from contextlog.schema import codec, keys
from contextlog.schema import events as ev
from contextlog.schema import notices as nt
from contextlog.worker.app import acl, bootstrap
from contextlog.worker.ingest import deadletters
from contextlog.worker.tasks.queue import SUMMARIES
from tests.support import services
from tests.support.api import api_process, make_key, receiver
from tests.support.processes import ROOT, Process, offline_env
from tests.support.running import eventually, running, settings_for
from tests.support.servers import (
    PostgresCluster,
    RedisServer,
    ServerMissing,
    free_port,
    redis_server_binary,
    require_servers,
)

pytestmark = pytest.mark.e2e

SOURCES = ("discord", "slack")
DB = 5  # not 0: every role also SELECTs the database of its REDIS_URL
A, C = "alpha", "general"
WORDS = "the deploy pipeline caches layers keyed by the lockfile hash " * 3  # ~48 tokens
API_ENV = {"CONTEXTLOG_WEBHOOK_ALLOW_PRIVATE": "true"}  # its webhook receiver is on loopback
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8


def redis7_or_skip() -> None:
    """The private Redis must take per-role users: 7.0 or newer."""
    try:
        binary = redis_server_binary()
    except ServerMissing as e:
        services.unavailable("redis-server 7", str(e))
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"v=(\d+)\.(\d+)", out)
    if found is None or (int(found[1]), int(found[2])) < acl.OLDEST:
        services.unavailable("redis-server 7", f"{binary} is {out.strip()!r}")


def contextlog_acl(env: dict[str, str], *options: str) -> str:
    """What `contextlog acl` prints, as an operator runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "contextlog.worker.cli.main", "acl", *options],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@dataclass
class Deployment:
    """A private Redis whose users are the printed rules, and each role's password."""

    server: RedisServer
    admin: redis.Redis  # the default user: the test's own eyes (replies as bytes)
    database_url: str
    workdir: Path
    variables: dict[str, str]  # CONTEXTLOG_REDIS_PASSWORD_<ROLE> -> its password
    passwords: dict[str, str]  # user name -> password
    started: list[Process] = field(default_factory=list)

    def url(self, role: str) -> str:
        user = f"contextlog-{role}"
        return f"redis://{user}:{self.passwords[user]}@127.0.0.1:{self.server.port}/{DB}"

    def client(self, role: str) -> redis.Redis:
        return redis.Redis.from_url(self.url(role), socket_timeout=10)

    def env(self, role: str, **extra: str) -> dict[str, str]:
        return offline_env(
            self.database_url,
            self.url(role),
            CONTEXTLOG_BLOCK_MS="100",
            CONTEXTLOG_LOG_FORMAT="console",
            CONTEXTLOG_WEBHOOK_ALLOW_PRIVATE="true",
            CONTEXTLOG_CONSUMER=f"{role}-1",
            **extra,
        )

    def start(self, role: str, command: str, **extra: str) -> Process:
        p = Process(command, self.env(role, **extra), self.workdir / f"{command}.log")
        self.started.append(p.start())
        return p

    def refusals(self) -> list[dict[str, str]]:
        """ACL LOG: who was refused what (key, command or channel) and why."""
        fields = ("username", "reason", "context", "object")
        return [{f: _str(e[f]) for f in fields} for e in self.admin.acl_log()]

    def logs(self) -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.tail(30)}" for p in self.started)

    def wait(self, check: Callable[[], bool], what: str, timeout: float = 60) -> None:
        """`eventually`, failing with ACL LOG and the processes' logs as they are then."""
        try:
            eventually(check, timeout, what)
        except AssertionError as e:
            raise AssertionError(f"{e}\nACL LOG: {self.refusals()}\n{self.logs()}") from None


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@pytest.fixture
def acl_users(tmp_path: Path) -> Iterator[Deployment]:
    """The private Redis with the printed users, no process yet (nor a database)."""
    redis7_or_skip()
    chosen = acl.roles([], SOURCES)
    secret = {r.name: secrets.token_hex(16) for r in chosen}
    variables = {r.password_var: secret[r.name] for r in chosen}
    aclfile = tmp_path / "users.acl"
    aclfile.write_text(contextlog_acl({**os.environ, **variables}, "--format", "file", *_sources()))
    with RedisServer(appendonly=False, extra=["--aclfile", str(aclfile)]) as server:
        admin = redis.Redis(port=server.port, db=DB, socket_timeout=10)
        passwords = {f"contextlog-{name}": pw for name, pw in secret.items()}
        yield Deployment(server, admin, "", tmp_path, variables, passwords)
        admin.close()


@pytest.fixture
def deployment(acl_users: Deployment, db: str) -> Iterator[Deployment]:
    """The users, and the test's database for the processes it starts (stopped at the end)."""
    acl_users.database_url = db
    try:
        yield acl_users
    finally:
        for p in acl_users.started:
            p.stop()


def _sources() -> list[str]:
    return [arg for s in SOURCES for arg in ("--source", s)]


@dataclass
class Inbox:
    """An adapter's notifications, as its bot reads them."""

    notes: Notifications
    seen: list[nt.Notice] = field(default_factory=list)

    def has(self, kind: str, channel: str, **fields: Any) -> bool:
        got = self.notes.read(block_ms=100)
        self.notes.ack(got)
        self.seen.extend(got)
        return any(
            n.kind == kind
            and n.channel == channel
            and all(getattr(n, k) == v for k, v in fields.items())
            for n in self.seen
        )


def http(method: str, url: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
    """One JSON request; (status, decoded body or text)."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=20) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def image() -> dict[str, Any]:
    data = base64.b64encode(PNG).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def test_every_role_runs_as_its_own_user_and_acl_log_stays_empty(deployment: Deployment) -> None:
    d = deployment
    d.start("ingest", "ingest")
    d.start("worker", "worker")
    dashboard_port = free_port()
    d.start("dashboard", "dashboard", CONTEXTLOG_DASHBOARD_PORT=str(dashboard_port))
    bot = Producer(d.client("adapter-discord"), shards=4)
    discord = Inbox(Notifications(d.client("adapter-discord"), "discord", consumer="bot"))
    slack = Inbox(Notifications(d.client("adapter-slack"), "slack", consumer="bot"))
    reader = ContextReader.from_url(d.database_url)
    try:
        _adapter_path(d, bot, discord, reader)
        api = api_process(d.database_url, d.url("api"), d.workdir / "api.log", **API_ENV)
        with api as (api_url, _):
            _api_path(d, api_url, slack)
        _dashboard_path(d, f"http://127.0.0.1:{dashboard_port}")
    finally:
        bot.close()
        discord.notes.close()
        slack.notes.close()
        reader.close()
    assert d.refusals() == [], d.logs()
    for p in d.started:
        assert p.proc is not None and p.proc.poll() is None, p.tail()


def _adapter_path(d: Deployment, bot: Producer, inbox: Inbox, reader: ContextReader) -> None:
    """A bot's day: messages, a batch (one EVAL), an image (a MULTI with its bytes), a save
    and its summary, a compaction, an idle auto-save."""
    bot.configure(A, C, token_budget=400, source="discord")
    bot.configure(A, "quiet", idle_timeout=2, source="discord")
    for i in range(2):
        bot.post_message(A, C, "user", f"q{i} {WORDS}", source="discord")
        bot.post_message(A, C, "assistant", f"a{i} {WORDS}", source="discord")
    bot.post_message(A, C, "user", f"q2 {WORDS}", source="discord")  # compaction queued
    with bot.batch() as b:
        for i in range(5):
            b.post_message(A, "batch", "user" if i % 2 == 0 else "assistant", f"b{i}")
    seen = bot.post_message(A, "pics", "user", [image(), {"type": "text", "text": "this?"}])
    bot.post_message(A, "quiet", "user", "anyone?", source="discord")
    bot.save(A, "batch", "the batch", source="discord")
    ctx = reader.context(A, "pics", wait_for=seen, timeout=20)
    assert ctx.messages[0]["content"][0]["source"]["data"] == image()["source"]["data"]
    for kind, channel, extra in (
        (nt.SESSION_SAVED, "batch", {}),
        (nt.SUMMARY_READY, "batch", {}),
        (nt.CONTEXT_COMPACTED, C, {}),
        (nt.SESSION_SAVED, "quiet", {"auto": True}),
    ):
        d.wait(lambda: inbox.has(kind, channel, **extra), f"{kind} of {channel}")  # noqa: B023


def _api_path(d: Deployment, url: str, slack: Inbox) -> None:
    """The HTTP API for the slack bot: posts (one with an image, a batch), a save, its
    notices over SSE and to a webhook (and a replay), status; the bot's own notices."""
    token = make_key(d.database_url, ["*"], "post,read,sessions,admin")
    conv = f"{url}/v1/agents/beta/channels/x"
    with receiver() as (hook, got):
        status, created = http(
            "POST",
            f"{url}/v1/webhooks",
            {"url": hook, "source": "slack", "kinds": [nt.SESSION_SAVED]},
            token,
        )
        assert status == 201, created
        content = [image(), {"type": "text", "text": "and this?"}]
        message = {"role": "user", "content": content, "source": "slack"}
        assert http("POST", f"{conv}/messages", message, token)[0] == 202
        items = [
            {"type": "message", "agent": "beta", "channel": "x", "role": "user", "content": f"m{i}"}
            for i in range(4)
        ]
        assert http("POST", f"{url}/v1/batch", {"items": items}, token)[0] == 202
        assert (
            http("POST", f"{conv}/sessions", {"description": "s", "source": "slack"}, token)[0]
            == 202
        )
        status, text = http(
            "GET", f"{url}/v1/agents/beta/notifications?source=slack&wait=20&limit=2", None, token
        )
        assert status == 200 and nt.SUMMARY_READY in text and nt.SESSION_SAVED in text, text
        ack = {"source": "slack", "through": re.findall(r"^id: (\S+)$", text, re.M)[-1]}
        acked = http("POST", f"{url}/v1/agents/beta/notifications/ack", ack, token)
        assert acked == (200, {"acked": 2}), acked
        d.wait(lambda: len(got.requests) == 1, "the webhook's delivery")
        hook_id = created["webhook_id"]
        status, listed = http("GET", f"{url}/v1/webhooks/{hook_id}/deliveries", None, token)
        delivery = listed["deliveries"][0]["delivery_id"]
        replay = f"{url}/v1/webhooks/{hook_id}/deliveries/{delivery}/replay"
        assert http("POST", replay, None, token)[0] == 202
        d.wait(lambda: len(got.requests) == 2, "the replayed delivery")
    status, report = http("GET", f"{url}/v1/status", None, token)
    assert status == 200 and report["healthy"], report
    for kind in (nt.SESSION_SAVED, nt.SUMMARY_READY):
        d.wait(lambda: slack.has(kind, "x"), f"{kind} for the slack bot")  # noqa: B023
    done = subprocess.run(
        [sys.executable, "-m", "contextlog.worker.cli.main", "status", "--json"],
        env=d.env("api"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _dashboard_path(d: Deployment, url: str) -> None:
    """rq-dashboard's views, and its actions on a failed job: requeue, then empty."""
    d.wait(lambda: _answers(url + "/0/data/queues.json"), "the dashboard")
    summaries = Queue(SUMMARIES, connection=d.admin)
    failing = summaries.enqueue_call("contextlog.worker.tasks.jobs.no_such_job", failure_ttl=3600)
    failed = summaries.failed_job_registry
    d.wait(lambda: failing.id in failed.get_job_ids(), "a failed job")
    for page in (
        "/0/data/queues.json",
        "/0/data/workers.json",
        f"/0/data/jobs/{SUMMARIES}/failed/8/asc/1.json",
        f"/0/data/jobs/{SUMMARIES}/finished/8/asc/1.json",
        "/0/data/jobs/idle/scheduled/8/asc/1.json",
        f"/0/data/job/{failing.id}.json",
    ):
        status, body = http("GET", url + page)
        assert status == 200, (page, body)
    assert http("POST", f"{url}/job/{failing.id}/requeue") == (200, {"status": "OK"})
    d.wait(lambda: failing.id in failed.get_job_ids(), "the requeued job failing again")
    assert http("POST", f"{url}/queue/{SUMMARIES}/failed/empty") == (200, {"status": "OK"})
    assert failed.get_job_ids() == []


def _answers(url: str) -> bool:
    try:
        return http("GET", url)[0] == 200
    except OSError:
        return False


def test_an_adapter_reads_no_other_source_and_cannot_write_a_result(
    deployment: Deployment,
) -> None:
    d = deployment
    d.start("ingest", "ingest")
    mine = d.client("adapter-discord")
    bot = Producer(mine, shards=4)
    reader = ContextReader.from_url(d.database_url)
    try:
        slack = Notifications(d.client("adapter-slack"), "slack", consumer="bot")
        slack.read(block_ms=None)  # the other bot's group exists: only ACL stands between
        slack.close()
        reader.context(A, C, wait_for=bot.post_message(A, C, "user", "hi", source="discord"))
        last = bot.post_message(A, C, "assistant", "hello", source="discord")
        before = reader.context(A, C, wait_for=last).messages
        entry = _forge_compaction(mine)
        d.wait(lambda: _forged(d.admin) == 1, "the forged entry dead-lettered")
        after = reader.context(A, C, wait_for=bot.post_message(A, C, "user", "still here"))
        assert after.messages[:-1] == before and "EVIL" not in str(after.to_anthropic())
        _refused(mine, entry)
    finally:
        bot.close()
        reader.close()
    log = d.refusals()
    assert {e["username"] for e in log} == {"contextlog-adapter-discord"}, log
    assert {keys.outbox("slack"), keys.stream(0), keys.lease(0)} <= {e["object"] for e in log}


def _forge_compaction(client: redis.Redis) -> str:
    """What a compromised adapter can try: a worker's result, XADDed raw and unsigned,
    hiding every later message behind an injected summary."""
    forged = ev.ContextCompacted(
        event_id=uuid7(),
        agent=A,
        channel=C,
        occurred_at=dt.datetime.now(dt.UTC),
        through_seq=10**12,
        summary="EVIL",
    )
    stream = keys.stream(keys.shard_of(A, C, 4))
    return _str(client.xadd(stream, {codec.ENTRY_FIELD: codec.encode(forged)}))


def _forged(admin: redis.Redis) -> int:
    letters = deadletters.newest(admin, 4, 100)
    return sum(1 for d in letters if d.fields[b"reason"] == b"forged")


# What an adapter's user may not do: each is refused by Redis (NOPERM).
REFUSED: tuple[tuple[str, Callable[[redis.Redis, str], Any]], ...] = (
    ("read another source's notifications", lambda r, _: r.xrange(keys.outbox("slack"))),
    (
        "consume them in their group",
        lambda r, _: r.xreadgroup("adapter", "thief", {keys.outbox("slack"): "0"}),
    ),
    ("read them backwards", lambda r, _: r.xrevrange(keys.outbox("slack"))),
    ("write a notice", lambda r, _: r.xadd(keys.outbox("slack"), {"n": "{}"})),
    ("read an inbound stream", lambda r, _: r.xrange(keys.stream(0))),
    (
        "consume it as ingest",
        lambda r, _: r.xreadgroup(keys.INGEST_GROUP, "thief", {keys.stream(0): ">"}),
    ),
    ("acknowledge ingest's entries", lambda r, e: r.xack(keys.stream(0), keys.INGEST_GROUP, e)),
    ("trim an inbound stream", lambda r, _: r.xtrim(keys.stream(0), maxlen=0)),
    ("overwrite an inbound stream", lambda r, _: r.set(keys.stream(0), "x")),
    ("read a shard's lease", lambda r, _: r.get(keys.lease(0))),
    ("read the dead letters", lambda r, _: r.xrevrange(keys.dead_letters(0))),
    ("read RQ's queue", lambda r, _: r.lrange(f"rq:queue:{SUMMARIES}", 0, -1)),
    ("read an attachment back", lambda r, _: r.get(keys.attachment(0, "0" * 64))),
)


def _refused(client: redis.Redis, entry: str) -> None:
    for what, attempt in REFUSED:
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt(client, entry)
            pytest.fail(f"an adapter could {what}")
    # A script's own commands are checked too: EVAL on an inbound stream cannot read it.
    script = "return redis.call('XRANGE', KEYS[1], '-', '+')"
    with pytest.raises(redis.exceptions.ResponseError, match="can't run this command"):
        client.eval(script, 1, keys.stream(0))


def test_the_setuser_form_through_redis_cli_makes_the_same_users(
    acl_users: Deployment,
) -> None:
    """`contextlog acl | redis-cli` (README) gives the users the ACL file gave."""
    cli = shutil.which("redis-cli") or str(Path(redis_server_binary()).with_name("redis-cli"))
    if not os.access(cli, os.X_OK):
        services.unavailable("redis-cli", "install redis-tools")
    lines = contextlog_acl({**os.environ, **acl_users.variables}, *_sources())
    with RedisServer(appendonly=False) as other:
        done = subprocess.run(
            [cli, "-p", str(other.port)], input=lines, capture_output=True, text=True, timeout=30
        )
        assert done.stdout.split() == ["OK"] * len(lines.splitlines()), done.stdout + done.stderr
        theirs = redis.Redis.from_url(other.url)
        made = _users(theirs)
        theirs.close()
    assert made == _users(acl_users.admin)
    assert len(made) == len(SOURCES) + 4 + 1  # the roles, and the default user


def _users(client: redis.Redis) -> dict[str, tuple[list[str], list[list[str]]]]:
    """ACL LIST by user: its root rules and its selectors' rules, each sorted (Redis lists
    the commands of a rule set in no fixed order)."""
    out = {}
    for line in client.acl_list():
        text = _str(line)
        selectors = sorted(sorted(s.split()) for s in re.findall(r"\(([^)]*)\)", text))
        _, name, *root = re.sub(r"\([^)]*\)", "", text).split()
        out[name] = (sorted(root), selectors)
    return out


def test_an_adapters_postgres_role_reads_contexts_and_sessions_but_no_secret(
    redis_url: str, tmp_path: Path
) -> None:
    """`contextlog acl --postgres` on a private cluster (a role is cluster-wide): the
    reader role an adapter gets reads what `ContextReader` reads, and none of the signing
    key, API keys or webhook secrets."""
    require_servers()
    with PostgresCluster.start_new() as pg:
        database_url = services.create_database(pg.url, "contextlog")
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(contextlog_acl(dict(os.environ), "--postgres").encode())
        settings = settings_for(database_url, redis_url)
        assert len(bootstrap.signing_key(settings).get()) == 32  # made, in contextlog_secrets
        producer = Producer(redis.Redis.from_url(redis_url), shards=4)
        reader = ContextReader.from_url(_as_reader(database_url))
        try:
            with running(settings):
                content = [image(), {"type": "text", "text": "look"}]
                seen = producer.post_message(A, C, "user", content, source="discord")
                assert reader.context(A, C, wait_for=seen).messages[0]["content"][0] == image()
                saved = producer.save(A, C, "pictures", source="discord")
                reader.context(A, C, wait_for=saved)
            (listed,) = reader.sessions(A).sessions
            info, messages = reader.session_messages(listed.session_id, agent=A, channel=C)
            assert info.description == "pictures" and len(messages) == 1
            assert reader.segment(A, C).messages
        finally:
            producer.close()
            reader.close()
        with psycopg.connect(_as_reader(database_url), autocommit=True) as conn:
            for table in ("contextlog_secrets", "api_keys", "webhooks", "webhook_deliveries"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(f"SELECT * FROM {table}")


def _as_reader(url: str) -> str:
    """The URL as the role `contextlog acl --postgres` made (the cluster trusts loopback)."""
    return url.replace("postgres@", "contextlog_reader@", 1)


# Paths the day above does not reach (crash recovery, a worker's takeover, rq's rarer
# commands, the API's status on a lagging shard), from the code; then what each role may
# not do. ACL DRYRUN asks Redis itself whether the user may, without running anything.
MAY: dict[str, list[str]] = {
    "ingest": [
        "XCLAIM contextlog:in:{0} ingest ingest-2 0 1-0",
        "XGROUP DELCONSUMER contextlog:in:{0} ingest ingest-2",
        "XRANGE contextlog:in:{0} 1-0 1-0 COUNT 1",
        "XPENDING contextlog:in:{0} ingest - + 100 ingest-2",
        "SET contextlog:inflight:{0} 1-0",
        "DEL contextlog:inflight:{0}",
        "ZRANGEBYSCORE contextlog:ingest:runs 0 +inf",
    ],
    "worker": [
        "PEXPIRE contextlog:idle:{ab} 1000",
        "EXPIRE contextlog:compacting:{ab} 10",
        "HGETALL contextlog:worker:{contextlog-w}:sweep",
        "TTL rq:worker:contextlog-w",
        "LPOS rq:queue:summaries job",
        "ZPOPMIN rq:scheduled:idle",
        "SUBSCRIBE rq:pubsub:contextlog-w",
    ],
    "api": [
        "XINFO STREAM contextlog:in:{0}",
        "XRANGE contextlog:in:{0} (1-0 + COUNT 100",
        "XPENDING contextlog:in:{0} ingest",
        "XPENDING contextlog:out:{slack} api:beta:adapter - 1-0 100 http",
    ],
    "dashboard": ["RENAME rq:queue:summaries rq:queue:summaries:tmp", "LPOP rq:queue:summaries"],
    "adapter-discord": [
        "XREVRANGE contextlog:out:{discord} + - COUNT 1",
        "XREAD COUNT 1 STREAMS contextlog:out:{discord} 0",
        "XPENDING contextlog:out:{discord} adapter - 1-0 100 bot",
    ],
}
MAY_NOT: dict[str, list[str]] = {
    "ingest": ["HSET contextlog:worker:{w}:sweep beat 1", "PUBLISH rq:pubsub:w x"],
    "worker": [
        "XRANGE contextlog:in:{0} - +",
        "XACK contextlog:in:{0} ingest 1-0",
        "GET contextlog:lease:{0}",
        "XRANGE contextlog:dead:{0} - +",
        "CLIENT KILL ID 1",
    ],
    "api": [
        "XACK contextlog:in:{0} ingest 1-0",
        "XREADGROUP GROUP ingest api STREAMS contextlog:in:{0} >",
        "XTRIM contextlog:in:{0} MAXLEN 0",
        "DEL contextlog:in:{0}",
        "SET contextlog:lease:{0} api",
        "HINCRBY contextlog:stats:{0} dead:forged 1",
    ],
    "dashboard": [
        "GET contextlog:shards",
        "XRANGE contextlog:out:{slack} - +",
        "PUBLISH rq:pubsub:contextlog-w shutdown",
    ],
    "adapter-discord": [
        "XREAD COUNT 1 STREAMS contextlog:out:{slack} 0",
        "XADD contextlog:out:{discord} * n {}",
        "SCAN 0",
        "INFO",
        "XADD contextlog:dead:{0} * reason x",
    ],
}


@pytest.mark.parametrize("role", sorted(MAY))
def test_paths_the_day_misses_are_allowed_and_the_rest_is_refused(
    acl_users: Deployment, role: str
) -> None:
    user = f"contextlog-{role}"
    asked = {cmd: _str(acl_users.admin.acl_dryrun(user, *cmd.split())) for cmd in MAY[role]}
    assert {c: r for c, r in asked.items() if r != "OK"} == {}
    refused = {cmd: _str(acl_users.admin.acl_dryrun(user, *cmd.split())) for cmd in MAY_NOT[role]}
    assert {c: r for c, r in refused.items() if "no permissions" not in r} == {}
