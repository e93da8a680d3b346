"""Settings are read in one place and a bad value names its variable."""

from __future__ import annotations

import re

import pytest

from contextlog.schema.defaults import FOREVER, Keep
from contextlog.schema.errors import ConfigError
from contextlog.worker.app.config import Settings


def test_defaults_when_nothing_is_set() -> None:
    s = Settings.from_env({})
    assert s.redis_url == "redis://127.0.0.1:6379/0"
    assert s.shards == 4
    assert (s.batch_size, s.batch_bytes) == (2000, 2 << 20)
    assert s.max_entry_bytes == 256 * 1024
    assert s.consumer  # host-pid by default


def test_values_are_parsed() -> None:
    s = Settings.from_env(
        {
            "REDIS_URL": "unix:///tmp/r.sock?db=3",
            "DATABASE_URL": "postgresql://u@h/db",
            "CONTEXTLOG_SHARDS": "8",
            "CONTEXTLOG_BATCH_SIZE": "100",
            "CONTEXTLOG_BATCH_BYTES": "65536",
            "CONTEXTLOG_LEASE_SECONDS": "2.5",
            "CONTEXTLOG_CONSUMER": "ingest-1",
            "CONTEXTLOG_LOG_FORMAT": "Console",
        }
    )
    assert (s.shards, s.batch_size, s.batch_bytes, s.lease_seconds) == (8, 100, 65536, 2.5)
    assert (s.consumer, s.log_format) == ("ingest-1", "console")


@pytest.mark.parametrize(("raw", "value"), [("0", False), ("no", False), ("TRUE", True)])
def test_logs_are_for_people_on_a_terminal_and_may_go_unstamped(raw: str, value: bool) -> None:
    defaults = Settings.from_env({})
    assert (defaults.log_format, defaults.log_timestamps) == ("auto", True)
    assert Settings.from_env({"CONTEXTLOG_LOG_TIMESTAMPS": raw}).log_timestamps is value


def test_readers_built_from_settings_use_the_replica() -> None:
    url = "postgresql://u@replica/db"
    env = {"CONTEXTLOG_REPLICA_URL": url, "CONTEXTLOG_REPLICA_MAX_LAG": "2"}
    options = Settings.from_env({**env, "CONTEXTLOG_REPLICA_WAIT": "0.1"}).reader_options()
    assert (options["replica_url"], options["max_replica_lag"], options["replica_wait"]) == (
        url,
        2.0,
        0.1,
    )
    assert Settings.from_env({}).reader_options()["replica_url"] is None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("REDIS_URL", "localhost", "REDIS_URL is not a redis://, redis+cluster:// or unix://"),
        ("DATABASE_URL", "mysql://x", "DATABASE_URL is not a postgresql:// URL"),
        ("CONTEXTLOG_BATCH_SIZE", "lots", "CONTEXTLOG_BATCH_SIZE is not a whole number"),
        ("CONTEXTLOG_BATCH_SIZE", "0", "CONTEXTLOG_BATCH_SIZE must be between"),
        ("CONTEXTLOG_BATCH_BYTES", "0", "CONTEXTLOG_BATCH_BYTES must be between"),
        ("CONTEXTLOG_LEASE_SECONDS", "0.1", "CONTEXTLOG_LEASE_SECONDS must be between"),
        ("CONTEXTLOG_LOG_LEVEL", "loud", "CONTEXTLOG_LOG_LEVEL must be one of"),
        ("REDIS_URL", "", "REDIS_URL is set but empty: give a URL, or unset it for the default"),
        ("DATABASE_URL", " ", "DATABASE_URL is set but empty"),
        ("CONTEXTLOG_QUEUE_REDIS_URL", "", "CONTEXTLOG_QUEUE_REDIS_URL is set but empty"),
        ("CONTEXTLOG_IDLE_TIMEOUT", "soon", "CONTEXTLOG_IDLE_TIMEOUT is not a duration: 'soon'"),
        ("CONTEXTLOG_ROLLING_WINDOW", "0", "CONTEXTLOG_ROLLING_WINDOW must be at least 1"),
        ("CONTEXTLOG_LOG_FORMAT", "xml", "CONTEXTLOG_LOG_FORMAT must be one of auto, json"),
        ("CONTEXTLOG_LOG_TIMESTAMPS", "maybe", "CONTEXTLOG_LOG_TIMESTAMPS must be 1 or 0"),
        ("CONTEXTLOG_SHARDS", "x", "CONTEXTLOG_SHARDS is not a whole number"),
        ("REDIS_URL", "redis://127.0.0.1:6379/99x", "REDIS_URL names database '99x'"),
        ("REDIS_URL", "redis://127.0.0.1:6379/1/2", "REDIS_URL names database '1/2'"),
        ("REDIS_URL", "redis://127.0.0.1:6379?db=x", "REDIS_URL names database 'x'"),
        ("REDIS_URL", "unix:///tmp/r.sock?db=1a", "REDIS_URL names database '1a'"),
        ("REDIS_URL", "redis://127.0.0.1:port/1", "REDIS_URL has a port that is not a number"),
        ("CONTEXTLOG_REPLICA_URL", "replica:5432", "CONTEXTLOG_REPLICA_URL is not a postgresql"),
        ("CONTEXTLOG_REPLICA_MAX_LAG", "-1", "CONTEXTLOG_REPLICA_MAX_LAG must be between"),
        ("CONTEXTLOG_REPLICA_WAIT", "soon", "CONTEXTLOG_REPLICA_WAIT is not a number"),
    ],
)
def test_bad_value_names_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({name: value})
    assert message in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/13",
        "redis://127.0.0.1",
        "redis://127.0.0.1:6379/",
        "rediss://user:pw@h:6380/0?ssl_cert_reqs=none",
        "redis://h:6379?db=3",
        "unix:///tmp/r.sock?db=3",
    ],
)
def test_redis_urls_with_a_database_number_or_none_are_accepted(url: str) -> None:
    assert Settings.from_env({"REDIS_URL": url}).redis_url == url


def test_queue_redis_defaults_to_redis_url() -> None:
    s = Settings.from_env({"REDIS_URL": "redis://h:6379/3"})
    assert s.queue_redis_url == "redis://h:6379/3"


def test_a_cluster_needs_its_own_queue_redis() -> None:
    env = {"REDIS_URL": "redis+cluster://h:7000"}
    with pytest.raises(ConfigError, match="set CONTEXTLOG_QUEUE_REDIS_URL to a standalone"):
        Settings.from_env(env)
    s = Settings.from_env({**env, "CONTEXTLOG_QUEUE_REDIS_URL": "redis://q:6379/2"})
    assert (s.redis_url, s.queue_redis_url) == ("redis+cluster://h:7000", "redis://q:6379/2")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REDIS_URL": "redis+cluster://h:7000/2"}, "a Redis Cluster has database 0 only"),
        ({"REDIS_URL": "redis+cluster://h:port"}, "REDIS_URL has a port that is not a number"),
        (
            {"CONTEXTLOG_QUEUE_REDIS_URL": "redis+cluster://h:7000"},
            "CONTEXTLOG_QUEUE_REDIS_URL must be a standalone Redis",
        ),
        ({"CONTEXTLOG_QUEUE_REDIS_URL": "redis://h/x"}, "CONTEXTLOG_QUEUE_REDIS_URL names"),
    ],
)
def test_bad_cluster_urls_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env)


@pytest.mark.parametrize(
    ("raw", "seconds"), [("1800", 1800), ("30m", 1800), ("90s", 90), ("24h", 86400), ("0", 0)]
)
def test_durations_are_taken_as_the_cli_takes_them(raw: str, seconds: int) -> None:
    """`CONTEXTLOG_IDLE_TIMEOUT=30m` as `send configure --idle-timeout 30m` takes it."""
    window = raw if seconds else "1"  # a window of 0 is refused
    s = Settings.from_env({"CONTEXTLOG_IDLE_TIMEOUT": raw, "CONTEXTLOG_ROLLING_WINDOW": window})
    assert s.conversation.idle_timeout == seconds
    if seconds:
        assert s.conversation.rolling_window == seconds


SECRET = "s3cr3t-pw"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("REDIS_URL", f"redis://app:{SECRET}@localhost:port/1"),
        ("REDIS_URL", f"redis://:{SECRET}@localhost:6379/x"),
        ("REDIS_URL", f"http://app:{SECRET}@localhost:6379/0"),
        ("REDIS_URL", f"redis+cluster://app:{SECRET}@h:7000/2"),
        ("CONTEXTLOG_QUEUE_REDIS_URL", f"redis://app:{SECRET}@q/x"),
        ("CONTEXTLOG_QUEUE_REDIS_URL", f"redis+cluster://:{SECRET}@h:7000"),
        ("DATABASE_URL", f"mysql://app:{SECRET}@db/app"),
        ("DATABASE_URL", f"host=db user=app password={SECRET}"),
        ("DATABASE_URL", f"postgresql//app:{SECRET}@db"),
        ("CONTEXTLOG_REPLICA_URL", f"replica://app:{SECRET}@db?password={SECRET}"),
        ("ANTHROPIC_BASE_URL", f"ftp://u:{SECRET}@proxy"),
    ],
)
def test_a_bad_url_is_shown_without_its_password(name: str, value: str) -> None:
    env = {name: value}
    if name == "REDIS_URL" and "cluster" in value:
        env["CONTEXTLOG_QUEUE_REDIS_URL"] = "redis://q:6379/0"
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    assert name in str(info.value)
    assert SECRET not in str(info.value)


def test_a_cluster_redis_url_for_rq_is_shown_without_its_password() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"REDIS_URL": f"redis+cluster://app:{SECRET}@h:7000"})
    assert "redis+cluster://app:***@h:7000" in str(info.value)
    assert SECRET not in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://app:pw@h:6379/0", "redis://app:***@h:6379/0"),
        ("redis://:pw@h", "redis://:***@h"),
        ("redis://app:p@w:rd@h:1/2", "redis://app:***@h:1/2"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("redis://user@h", "redis://user@h"),
        (
            "postgresql://h/db?password=pw&sslmode=require",
            "postgresql://h/db?password=***&sslmode=require",
        ),
        ("host=h password=pw user=u", "host=h password=*** user=u"),
    ],
)
def test_redact(url: str, shown: str) -> None:
    from contextlog.producers.connection import redact

    assert redact(url) == shown


def test_retention_rules_from_the_environment() -> None:
    env = {
        "CONTEXTLOG_KEEP_LOG": "365d",
        "CONTEXTLOG_KEEP_SESSIONS": "forever",
        "CONTEXTLOG_RETENTION": "support=log:30d,sessions:7d; legal=log:forever",
    }
    rules = Settings.from_env(env).retention
    assert rules.for_agent("support") == Keep(30 * 86400, 7 * 86400)
    assert rules.for_agent("legal") == Keep(FOREVER, FOREVER)
    assert rules.for_agent("other") == Keep(365 * 86400, FOREVER)
    assert rules.enforced and not Settings.from_env({}).retention.enforced


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"CONTEXTLOG_KEEP_LOG": "2h"}, "CONTEXTLOG_KEEP_LOG must be at least a day"),
        ({"CONTEXTLOG_KEEP_SESSIONS": "soon"}, "CONTEXTLOG_KEEP_SESSIONS is not a duration"),
        ({"CONTEXTLOG_RETENTION": "support"}, "is not AGENT=log:DURATION"),
        ({"CONTEXTLOG_RETENTION": "a=logs:1d"}, "'logs:1d' in 'a=logs:1d'"),
        ({"CONTEXTLOG_RETENTION": "a=log:1"}, "at least a day"),
        ({"CONTEXTLOG_RETENTION_BATCH": "0"}, "CONTEXTLOG_RETENTION_BATCH must be between"),
        ({"CONTEXTLOG_RETENTION_ARCHIVE": "/no/such/dir"}, "not an existing directory"),
    ],
)
def test_bad_retention_settings_name_the_variable(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        Settings.from_env(env)
