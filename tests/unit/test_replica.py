"""The replica policy's bounds and the routing counters (the reads are in
tests/integration/test_replica.py, against a real replica)."""

from __future__ import annotations

import math

import pytest

from contextlog.producers import ContextReader
from contextlog.producers.replica import PRIMARY, REPLICA, Policy, Routing
from contextlog.schema.errors import ConfigError


@pytest.mark.parametrize(
    ("kw", "name"), [({"max_lag": -1.0}, "max_replica_lag"), ({"wait": math.nan}, "replica_wait")]
)
def test_a_bound_below_zero_or_not_a_number_is_refused(kw: dict[str, float], name: str) -> None:
    with pytest.raises(ConfigError, match=f"{name} must be a number of seconds >= 0"):
        Policy(**kw)


def test_a_reader_with_a_bad_bound_is_refused_before_it_connects() -> None:
    with pytest.raises(ConfigError, match="replica_wait"):
        ContextReader.from_url(
            "postgresql://nobody@127.0.0.1:1/x", replica_url="x", replica_wait=-1
        )


def test_routing_counts_reads_and_fallbacks_by_reason() -> None:
    routing = Routing()
    routing.count(REPLICA)
    routing.count(PRIMARY, "lagging")
    routing.count(PRIMARY, "down")
    assert routing.snapshot() == {
        "primary": 2, "replica": 1, "lagging": 1, "behind": 0, "down": 1, "error": 0
    }  # fmt: skip


def test_a_reader_without_a_replica_reports_no_routing() -> None:
    reader = ContextReader.from_url("postgresql://nobody@127.0.0.1:1/x")
    assert reader.replica is None and reader.routing == {}
