"""The suite's own safety: it never flushes a Redis database it did not write."""

from __future__ import annotations

import fakeredis
import pytest

from tests.support.services import OWNED_MARK, NotOurs, flush_owned


def test_a_database_holding_someone_elses_keys_is_never_flushed() -> None:
    client = fakeredis.FakeRedis()
    client.set("app:session:42", "precious")
    with pytest.raises(NotOurs, match="holds 1 keys that no test run wrote"):
        flush_owned(client)
    assert client.get("app:session:42") == b"precious"


def test_an_empty_or_marked_database_is_flushed_and_marked() -> None:
    client = fakeredis.FakeRedis()
    flush_owned(client)
    assert client.exists(OWNED_MARK)
    client.set("contextlog:in:{0}", "left by a test")
    flush_owned(client)
    assert client.keys() == [OWNED_MARK.encode()]
