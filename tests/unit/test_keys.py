"""Sharding and key names: stable across processes, cluster-safe."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from contextlog.schema import keys
from contextlog.schema.errors import ConfigError


def test_shard_is_stable_across_processes() -> None:
    # Python's hash() is salted per process; our shard function must not be.
    code = "from schema.keys import shard_of; print(shard_of('alpha', 'general', 16))"
    runs = {subprocess.check_output([sys.executable, "-c", code]).strip() for _ in range(3)}
    assert runs == {str(keys.shard_of("alpha", "general", 16)).encode()}


def test_known_shard_values_never_change() -> None:
    # Changing these would send a live conversation to another stream: never do it.
    # (CRC-32 of b"alpha\x00c0" ... modulo 4, fixed when the first stream was written.)
    assert [keys.shard_of("alpha", f"c{i}", 4) for i in range(8)] == [2, 0, 2, 0, 3, 1, 3, 1]
    assert keys.shard_of("alpha", "general", 16) == 4


def test_agent_and_channel_do_not_run_together() -> None:
    assert keys.shard_of("ab", "c", 1024) != keys.shard_of("a", "bc", 1024)


def test_shards_spread_conversations_evenly() -> None:
    counts = Counter(keys.shard_of("agent", f"channel-{i}", 8) for i in range(8000))
    assert set(counts) == set(range(8))
    assert max(counts.values()) < 1.15 * min(counts.values())


def test_keys_keep_their_hash_tag() -> None:
    assert keys.stream(3) == "contextlog:in:{3}"
    assert keys.lease(3) == "contextlog:lease:{3}"
    assert keys.epoch(3) == "contextlog:epoch:{3}"
    assert keys.outbox("discord") == "contextlog:out:{discord}"


@pytest.mark.parametrize(("raw", "expected"), [(None, 4), ("", 4), ("16", 16), ("1", 1)])
def test_shard_count_from_env(raw: str | None, expected: int) -> None:
    env = {} if raw is None else {"CONTEXTLOG_SHARDS": raw}
    assert keys.shards_from_env(env) == expected


@pytest.mark.parametrize("raw", ["0", "-2", "four", "2000"])
def test_bad_shard_count_names_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError, match="CONTEXTLOG_SHARDS"):
        keys.shards_from_env({"CONTEXTLOG_SHARDS": raw})
