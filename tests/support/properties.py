"""Hypothesis profiles, chosen once for the whole suite by `tests/conftest.py`.

- `ci` (the default, for `make test` as for CI): derandomized, so every run of a checkout
  draws the same examples as CI did, and without an example database, so no failure
  stored by an earlier run in `.hypothesis/` is replayed into a later one;
- `dev` (`HYPOTHESIS_PROFILE=dev`): fresh random draws each run, and a failure found is
  kept in `.hypothesis/` and replayed first until it is fixed (`make clean` removes it);
- `nightly` (`HYPOTHESIS_PROFILE=nightly`): random draws, ten times the examples, every
  failure printed with the blob that reproduces it (`@reproduce_failure`).

A test that sets its own example count passes it through `examples(n)`, so `nightly`
scales it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from hypothesis import HealthCheck, settings

PROFILES: Final = ("ci", "dev", "nightly")
DEFAULT_PROFILE: Final = "ci"
VARIABLE: Final = "HYPOTHESIS_PROFILE"
NIGHTLY_FACTOR: Final = 10
BASE_EXAMPLES: Final = 100  # hypothesis's own default

# Each profile starts from hypothesis's own defaults, not from whatever profile is loaded
# (hypothesis loads its built-in `ci` by itself when CI is set).
_BASE: Final = settings.get_profile("default")
settings.register_profile(
    "ci",
    _BASE,
    derandomize=True,  # implies database=None
    deadline=None,  # a shared CI machine's pauses are not a test's failure
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", _BASE, deadline=None)
settings.register_profile(
    "nightly",
    _BASE,
    max_examples=BASE_EXAMPLES * NIGHTLY_FACTOR,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def profile_name(env: Mapping[str, str]) -> str:
    """The profile `env` asks for; an unknown name is refused, not ignored, and so is
    `dev` in CI (CI=true), where nothing an earlier run stored may be replayed."""
    name = env.get(VARIABLE, "").strip() or DEFAULT_PROFILE
    if name not in PROFILES:
        raise ValueError(f"{VARIABLE} must be one of {', '.join(PROFILES)}: {name!r}")
    if name == "dev" and env.get("CI", "").lower() == "true":
        raise ValueError(f"{VARIABLE}=dev replays stored examples, which CI (CI=true) must not")
    return name


def load(env: Mapping[str, str]) -> str:
    """Load the profile `env` asks for; returns its name."""
    name = profile_name(env)
    settings.load_profile(name)
    return name


def examples(n: int) -> int:
    """A test's own example count, scaled as the loaded profile scales the default."""
    factor = NIGHTLY_FACTOR if settings.get_current_profile_name() == "nightly" else 1
    return n * factor


def fixed() -> bool:
    """Whether the loaded profile draws the same examples on every run."""
    return bool(settings().derandomize)
