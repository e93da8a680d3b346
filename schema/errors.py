"""Every exception contextlog raises on purpose derives from `ContextlogError`.

ContextlogError
├── ConfigError          bad or missing configuration value
├── EventRejected        an event or stream entry fails the contract
│   └── EventTooLarge    an entry is over the size cap
├── MigrationError       the database schema cannot be brought up to date
├── Unavailable          Postgres or Redis cannot be reached (or Redis is full)
│   └── PushUncertain    a push may have been stored: resend it, never push again
├── Fenced               this ingest lost its shard to a newer owner
├── Conflict             another writer stored some of the same events meanwhile
├── StorageRefused       the database refused an event the contract accepted
├── NotVisible           a read waited for an event that was not stored in time
├── Refused              a request about sessions cannot be done (unknown, foreign, bad file)
└── ModelFailed          the model behind a reply (the Anthropic API) gave none
"""

from __future__ import annotations


class ContextlogError(Exception):
    """Root of all contextlog errors."""


class ConfigError(ContextlogError):
    """Raised when a configuration value is missing or invalid; the message names it."""


class EventRejected(ContextlogError):
    """Raised when an event or stream entry does not satisfy the event contract."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class EventTooLarge(EventRejected):
    """Raised when an encoded event is over the entry-size cap."""


class MigrationError(ContextlogError):
    """Raised when a migration fails; the database is left at the last good version."""


class Unavailable(ContextlogError):
    """Raised when Postgres or Redis cannot be reached."""


class PushUncertain(Unavailable):
    """Raised when a push failed after Redis may have taken some of it: the connection
    broke or timed out after sending (twice: the producer retries once with the same
    entries), or a full Redis took part of a pipeline. `event_ids` are the push's events.
    Retry with `producer.resend(error)`: the same entries, with the same event ids, which
    ingest stores once. Pushing the same messages again would make new events (unless
    they carry an `external_id`), stored twice."""

    def __init__(self, message: str, event_ids: list[str], entries: tuple[object, ...]) -> None:
        super().__init__(message)
        self.event_ids = event_ids
        self.entries = entries  # what `resend` sends again, as it was prepared


class Fenced(ContextlogError):
    """Raised when a newer owner of a shard has committed: this process must let go."""


class ShardBusy(ContextlogError):
    """Raised when a shard's checkpoint stays locked (a stalled former writer still holds
    its transaction, or a rebuild runs): nothing was written; retry later, in order."""


class Conflict(ContextlogError):
    """Raised when another writer stored some of a batch's events first; retrying is safe."""


class StorageRefused(ContextlogError):
    """Raised when the database refuses a batch for its data (not for an outage)."""


class NotVisible(ContextlogError):
    """Raised when a read's `wait_for` event was not stored within its timeout."""


class Refused(ContextlogError):
    """Raised when a session request is refused: no such session, a session of another
    conversation, or an import file that is not a valid export; or a retention request
    (`contextlog retire`) that would break the log's rules; the message says which."""


class ModelFailed(ContextlogError):
    """Raised when the Anthropic API gives no reply (unreachable, timed out, rate limited,
    an error status or an unreadable answer); the message says which, on one line."""


def one_line(error: BaseException | str) -> str:
    """An error's message on one line (libpq's span several, with tabs); an exception
    without a message is named by its class."""
    text = " ".join(str(error).split())
    return text or (type(error).__name__ if isinstance(error, BaseException) else "")
