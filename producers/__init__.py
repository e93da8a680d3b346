"""What adapters import: push events, read context and sessions, receive notifications."""

from producers.commands import Batch
from producers.context import Context
from producers.history import SessionInfo, SessionPage
from producers.notifications import AsyncNotifications, Notifications
from producers.producer import AsyncProducer, Producer
from producers.reader import AsyncContextReader, ContextReader
from schema import notices
from schema.errors import (
    ConfigError,
    ContextlogError,
    EventRejected,
    EventTooLarge,
    NotVisible,
    Refused,
    Unavailable,
)
from schema.notices import Notice

__all__ = [
    "AsyncContextReader",
    "AsyncNotifications",
    "AsyncProducer",
    "Batch",
    "ConfigError",
    "Context",
    "ContextReader",
    "ContextlogError",
    "EventRejected",
    "EventTooLarge",
    "NotVisible",
    "Notice",
    "Notifications",
    "Producer",
    "Refused",
    "SessionInfo",
    "SessionPage",
    "Unavailable",
    "notices",
]
