"""What adapters import: push events, read context and sessions, receive notifications."""

from contextlog.producers.commands import Batch
from contextlog.producers.context import Context
from contextlog.producers.history import SessionInfo, SessionPage
from contextlog.producers.notifications import AsyncNotifications, Notifications
from contextlog.producers.producer import AsyncProducer, Producer
from contextlog.producers.reader import AsyncContextReader, ContextReader
from contextlog.schema import notices
from contextlog.schema.errors import (
    ConfigError,
    ContextlogError,
    EventRejected,
    EventTooLarge,
    NotVisible,
    PushUncertain,
    Refused,
    Unavailable,
)
from contextlog.schema.notices import Notice

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
    "PushUncertain",
    "Refused",
    "SessionInfo",
    "SessionPage",
    "Unavailable",
    "notices",
]
