"""The hypothesis profiles the suite runs under (tests/support/properties.py)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase

from tests.support import properties


def test_every_run_draws_the_same_examples_unless_told_otherwise() -> None:
    assert properties.profile_name({}) == "ci"
    assert properties.profile_name({"CI": "true", "HYPOTHESIS_PROFILE": " "}) == "ci"
    ci = settings.get_profile("ci")
    assert ci.derandomize and ci.database is None  # nothing stored is replayed


def test_the_other_profiles_are_chosen_by_hand() -> None:
    assert properties.profile_name({"HYPOTHESIS_PROFILE": "nightly"}) == "nightly"
    nightly = settings.get_profile("nightly")
    assert not nightly.derandomize and nightly.database is None
    assert (
        nightly.max_examples == properties.NIGHTLY_FACTOR * settings.get_profile("ci").max_examples
    )
    dev = settings.get_profile("dev")
    assert not dev.derandomize and isinstance(dev.database, DirectoryBasedExampleDatabase)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"HYPOTHESIS_PROFILE": "fast"}, "must be one of ci, dev, nightly: 'fast'"),
        ({"HYPOTHESIS_PROFILE": "dev", "CI": "true"}, "must not"),
    ],
)
def test_a_profile_that_cannot_be_used_is_refused(env: dict[str, str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        properties.profile_name(env)


def test_this_run_replays_nothing_an_earlier_run_stored() -> None:
    if settings.get_current_profile_name() == "dev":
        pytest.skip("HYPOTHESIS_PROFILE=dev replays stored examples on purpose")
    assert settings().database is None
