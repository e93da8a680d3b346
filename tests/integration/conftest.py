"""Fixtures of the integration tests."""

from tests.support.session_stack import stack

__all__ = ["stack"]
