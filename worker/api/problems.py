"""Errors as RFC 9457 problem details, with the library's error classes and reasons.

Every refusal the API makes is an `ApiError`; every error the library raises maps to one
here (`from_error`), so a client sees the same class (`EventRejected`, `Refused`, ...) and
reason (`invalid`, `oversized`, ...) as a Python adapter would. Anything else is a 500
whose detail says nothing of the server's insides (the log has the traceback).
"""

from __future__ import annotations

from typing import Final

import msgspec
from msgspec import UNSET, Struct, UnsetType

from contextlog.schema.errors import (
    ConfigError,
    ContextlogError,
    EventRejected,
    EventTooLarge,
    NotVisible,
    Refused,
    Unavailable,
)

MEDIA_TYPE: Final = "application/problem+json"
BASE: Final = "https://contextlog.dev/problems/"
RETRY_UNAVAILABLE_S: Final = 1


class Problem(Struct, kw_only=True, omit_defaults=True):
    """A problem detail: `type` names the kind of error, `detail` what was wrong and what
    to do; `error` is the library's exception class, `reason` its reason code."""

    type: str
    title: str
    status: int
    detail: str
    error: str | UnsetType = UNSET
    reason: str | UnsetType = UNSET
    item: int | UnsetType = UNSET  # the batch item at fault


class ApiError(Exception):
    """Raised by handlers and the request pipeline to answer with a problem."""

    def __init__(
        self,
        status: int,
        kind: str,
        detail: str,
        *,
        error: str | None = None,
        reason: str | None = None,
        retry_after: int | None = None,
        item: int | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.detail = detail
        self.error = error
        self.reason = reason
        self.retry_after = retry_after
        self.item = item

    def problem(self) -> Problem:
        """The problem detail this error answers with."""
        return Problem(
            type=BASE + self.kind,
            title=self.kind.replace("-", " "),
            status=self.status,
            detail=self.detail,
            error=self.error if self.error is not None else UNSET,
            reason=self.reason if self.reason is not None else UNSET,
            item=self.item if self.item is not None else UNSET,
        )

    def headers(self) -> dict[str, str]:
        """Headers the status asks for."""
        out = {}
        if self.retry_after is not None:
            out["Retry-After"] = str(self.retry_after)
        if self.status == 401:
            out["WWW-Authenticate"] = 'Bearer realm="contextlog"'
        return out


def from_error(e: ContextlogError, item: int | None = None) -> ApiError:
    """The answer to a library error: EventTooLarge 413, EventRejected 422, Refused 409,
    NotVisible and Unavailable 503 (retry: the event may still land; the server may
    come back), a configuration mismatch 500."""
    name = type(e).__name__
    if isinstance(e, EventTooLarge):
        return ApiError(413, "event-too-large", e.detail, error=name, reason=e.reason, item=item)
    if isinstance(e, EventRejected):
        return ApiError(422, "event-rejected", e.detail, error=name, reason=e.reason, item=item)
    if isinstance(e, Refused):
        return ApiError(409, "refused", str(e), error=name, item=item)
    if isinstance(e, NotVisible):
        return ApiError(503, "not-visible", str(e), error=name, retry_after=RETRY_UNAVAILABLE_S)
    if isinstance(e, Unavailable):
        return ApiError(503, "unavailable", str(e), error=name, retry_after=RETRY_UNAVAILABLE_S)
    if isinstance(e, ConfigError):
        return ApiError(500, "misconfigured", str(e), error=name)
    return ApiError(500, "internal", f"{name}: the request could not be done", error=name)


def invalid(e: msgspec.ValidationError | msgspec.DecodeError, where: str) -> ApiError:
    """A body or query that does not fit the contract (422), or is not JSON (400)."""
    if isinstance(e, msgspec.ValidationError):
        return ApiError(422, "invalid-request", f"{where}: {e}", reason="invalid")
    return ApiError(400, "malformed-request", f"{where} is not valid JSON: {e}", reason="malformed")


def encode(problem: Problem) -> bytes:
    """The JSON body of a problem."""
    return msgspec.json.encode(problem)
