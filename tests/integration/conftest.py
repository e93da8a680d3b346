"""Fixtures of the integration tests."""

from collections.abc import Iterator

import pytest

from contextlog.producers import ContextReader
from contextlog.schema.defaults import ConversationDefaults
from tests.support.session_stack import stack
from tests.support.thinking_bot import Log

__all__ = ["stack"]


@pytest.fixture
def reader(db: str) -> Iterator[ContextReader]:
    """A reader on the test's database, with the default settings."""
    r = ContextReader.from_url(db, defaults=ConversationDefaults())
    yield r
    r.close()


@pytest.fixture
def log(db: str, request: pytest.FixtureRequest) -> Iterator[Log]:
    """A log written as ingest writes it, its clock at the module's `LOG_START` (if it
    names one) or at `NOW` (if it names that)."""
    lg = Log(db)
    module = request.module
    lg.now = getattr(module, "LOG_START", getattr(module, "NOW", lg.now))
    yield lg
    lg.close()
