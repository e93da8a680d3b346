"""What adapters import: push events (and, later, read context, sessions, notifications)."""

from producers.commands import Batch
from producers.producer import AsyncProducer, Producer
from schema.errors import ConfigError, ContextlogError, EventRejected, EventTooLarge, Unavailable

__all__ = [
    "AsyncProducer",
    "Batch",
    "ConfigError",
    "ContextlogError",
    "EventRejected",
    "EventTooLarge",
    "Producer",
    "Unavailable",
]
