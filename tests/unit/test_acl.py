"""The ACL rules per role (worker/app/acl.py) and `contextlog acl`: every key the code names
is reached by the roles that use it and by no other, and the printed users carry no secret.
tests/e2e/test_acl.py runs the processes as these users on a real Redis."""

from __future__ import annotations

import fnmatch
import hashlib

import pytest

from contextlog.schema import keys
from contextlog.schema.errors import ConfigError
from contextlog.worker.app import acl
from contextlog.worker.app.config import Settings
from contextlog.worker.cli.main import main
from contextlog.worker.tasks.queue import compaction_claim
from contextlog.worker.tasks.sweeper import heartbeat_key
from contextlog.worker.tasks.timers import bucket_key, timer_key

SHA = "ab" * 32
RQ_QUEUE = "rq:queue:summaries"


def reach(role: acl.Role, key: str) -> set[str]:
    """The commands `role` may send on `key` (its grants whose patterns match it)."""
    return {
        command
        for grant in role.grants
        for rule in grant.keys
        if fnmatch.fnmatchcase(key, rule.split("~", 1)[1])
        for command in grant.commands
    }


def test_an_adapter_pushes_anywhere_and_reads_only_its_own_notifications() -> None:
    discord = acl.adapter("discord")
    assert reach(discord, keys.stream(3)) == {"xadd", "eval"}
    assert reach(discord, keys.attachment(1, SHA)) == {"set"}
    assert reach(discord, keys.SHARDS_KEY) == {"get"}
    assert set(acl.CONSUMER) <= reach(discord, keys.outbox("discord"))
    others = [keys.outbox("slack"), keys.outbox("discord2"), keys.lease(0), keys.epoch(0)]
    others += [keys.dead_letters(0), keys.stats(0), keys.inflight(0), keys.MEMBERS, RQ_QUEUE]
    others += [timer_key("a", "c"), bucket_key(1), compaction_claim("a", "c"), heartbeat_key("w")]
    assert {k: reach(discord, k) for k in others} == {k: set() for k in others}
    push = next(g for g in discord.grants if "xadd" in g.commands)
    assert push.keys == (f"%W~{acl.INBOUND}",)  # write only: it reads no stream


# The keys each role's code names, a sample of each kind.
INGEST_USES = [
    keys.stream(0), keys.dead_letters(1), keys.stats(2), keys.lease(3), keys.epoch(0),
    keys.inflight(1), keys.SHARDS_KEY, keys.MEMBERS, keys.RUNS, keys.outbox("x"),
    keys.attachment(0, SHA), timer_key("a", "c"), bucket_key(9), compaction_claim("a", "c"),
    RQ_QUEUE,
]  # fmt: skip
WORKER_USES = [
    keys.stream(0), keys.SHARDS_KEY, keys.outbox("x"), heartbeat_key("contextlog-w"),
    timer_key("a", "c"), bucket_key(9), compaction_claim("a", "c"), RQ_QUEUE,
]  # fmt: skip
API_USES = [
    keys.stream(0), keys.attachment(0, SHA), keys.outbox("x"), keys.lease(0),
    keys.LEGACY_DEAD_LETTERS, keys.LEGACY_STATS, heartbeat_key("w"), RQ_QUEUE,
]  # fmt: skip


@pytest.mark.parametrize(
    ("role", "reached"),
    [
        (acl.INGEST, INGEST_USES),
        (acl.WORKER, WORKER_USES),
        (acl.API, API_USES),
        (acl.DASHBOARD, [RQ_QUEUE, "rq:job:1", "rq:workers"]),
    ],
)
def test_each_role_reaches_the_keys_it_uses(role: acl.Role, reached: list[str]) -> None:
    assert [k for k in reached if not reach(role, k)] == []


def test_the_dashboard_and_the_worker_stay_out_of_what_they_do_not_use() -> None:
    assert reach(acl.DASHBOARD, keys.stream(0)) == set()
    assert reach(acl.DASHBOARD, keys.outbox("x")) == set()
    assert reach(acl.WORKER, keys.stream(0)) == {"xadd"}  # its results, signed
    assert reach(acl.WORKER, keys.lease(0)) == set()
    api_on_inbound = reach(acl.API, keys.stream(0))
    assert "xack" not in api_on_inbound and "xreadgroup" not in api_on_inbound


def test_a_user_carries_the_hash_of_its_password_never_the_password() -> None:
    secret = "s3cret-for-ingest"
    u = acl.user(acl.INGEST, "cl-", (7, 0), {"CONTEXTLOG_REDIS_PASSWORD_INGEST": secret}.get)
    digest = hashlib.sha256(secret.encode()).hexdigest()
    assert u.name == "cl-ingest"
    assert u.rules[:3] == ("reset", "on", f"#{digest}")
    assert secret not in u.setuser() and secret not in u.file_line()
    assert u.setuser().startswith("ACL SETUSER cl-ingest reset on #")
    assert u.file_line().startswith("user cl-ingest reset on #")
    assert "+client|setinfo" not in u.rules  # Redis 7.0 refuses the rule


def test_without_a_password_the_user_is_off() -> None:
    none: dict[str, str] = {}
    u = acl.user(acl.adapter("slack"), "contextlog-", (7, 2), none.get)
    assert u.rules[:2] == ("reset", "off") and not any(r.startswith(("#", ">")) for r in u.rules)
    assert "+client|setinfo" in u.rules  # 7.2 has it, and redis-py sends it
    assert acl.adapter("slack").password_var == "CONTEXTLOG_REDIS_PASSWORD_ADAPTER_SLACK"
    assert "(~contextlog:out:{slack} +xreadgroup" in u.setuser()


@pytest.mark.parametrize(("text", "version"), [("7", (7, 0)), ("7.2", (7, 2)), ("8.0.1", (8, 0))])
def test_redis_versions(text: str, version: tuple[int, int]) -> None:
    assert acl.parse_version(text) == version


@pytest.mark.parametrize(("text", "says"), [("6.2", "need Redis 7.0"), ("seven", "not a Redis")])
def test_an_older_or_unreadable_version_is_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        acl.parse_version(text)


@pytest.mark.parametrize("source", ["", "a b", "disc*rd", "x{1}", "a" * 65])
def test_a_source_that_is_no_plain_name_is_refused(source: str) -> None:
    with pytest.raises(ValueError, match="a source must be"):
        acl.adapter(source)


def test_roles_asked_for() -> None:
    assert [r.name for r in acl.roles([], [])] == ["ingest", "worker", "api", "dashboard"]
    both = acl.roles([], ["discord", "slack", "discord"])
    assert [r.name for r in both][:2] == ["adapter-discord", "adapter-slack"]
    assert [r.name for r in acl.roles(["worker"], ["discord"])] == ["worker"]
    with pytest.raises(ValueError, match="needs --source"):
        acl.roles(["adapter"], [])
    with pytest.raises(ValueError, match="share CONTEXTLOG_REDIS_PASSWORD_ADAPTER_MY_BOT"):
        acl.users(acl.roles(["adapter"], ["my-bot", "my_bot"]), "", (7, 0), {})


def test_passwords_are_read_with_the_settings() -> None:
    env = {"CONTEXTLOG_REDIS_PASSWORD_API": "pw-1", "CONTEXTLOG_REDIS_PASSWORD_WORKER": ""}
    s = Settings.from_env(env)
    assert s.redis_passwords == {"CONTEXTLOG_REDIS_PASSWORD_API": "pw-1"}
    assert "pw-1" not in repr(s)
    with pytest.raises(ConfigError, match="CONTEXTLOG_REDIS_PASSWORD_API holds spaces"):
        Settings.from_env({"CONTEXTLOG_REDIS_PASSWORD_API": "pw 1"})


def test_the_command_prints_one_line_per_user_and_notes_who_is_off(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTEXTLOG_REDIS_PASSWORD_INGEST", "pw-ingest")
    assert main(["acl", "ingest", "adapter", "--source", "discord", "--format", "file"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert [line.split()[:3] for line in lines] == [
        ["user", "contextlog-adapter-discord", "reset"],
        ["user", "contextlog-ingest", "reset"],
    ]
    assert "pw-ingest" not in out and " on #" in lines[1] and " off " in lines[0]
    assert "CONTEXTLOG_REDIS_PASSWORD_ADAPTER_DISCORD is not set" in err
    assert "INGEST" not in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["acl", "adapter"], "the adapter role needs --source"),
        (["acl", "--redis-version", "6.2"], "need Redis 7.0 or newer"),
        (["acl", "admin"], "no role 'admin'"),
        (["acl", "--source", "a b"], "a source must be"),
    ],
)
def test_the_command_refuses_what_it_cannot_print(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and says in err


def test_without_sources_it_says_no_adapter_is_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["acl"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 4 and "no adapter user" in err


def test_postgres_prints_the_readers_role_without_the_secret_tables(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["acl", "--postgres"]) == 0
    sql = capsys.readouterr().out
    statements = "\n".join(line for line in sql.splitlines() if not line.startswith("--"))
    assert "CREATE ROLE contextlog_reader LOGIN" in sql and "PASSWORD" not in statements
    start = sql.index("GRANT SELECT")
    grant = sql[start : sql.index("TO contextlog_reader;", start)]
    assert "attachments" in grant and "contextlog_secrets" not in grant
    assert "REVOKE ALL ON contextlog_secrets, api_keys, webhooks" in sql
