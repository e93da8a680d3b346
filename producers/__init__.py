"""What adapters import: push events, read context (and, later, sessions, notifications)."""

from producers.commands import Batch
from producers.context import Context
from producers.producer import AsyncProducer, Producer
from producers.reader import AsyncContextReader, ContextReader
from schema.errors import (
    ConfigError,
    ContextlogError,
    EventRejected,
    EventTooLarge,
    NotVisible,
    Unavailable,
)

__all__ = [
    "AsyncContextReader",
    "AsyncProducer",
    "Batch",
    "ConfigError",
    "Context",
    "ContextReader",
    "ContextlogError",
    "EventRejected",
    "EventTooLarge",
    "NotVisible",
    "Producer",
    "Unavailable",
]
