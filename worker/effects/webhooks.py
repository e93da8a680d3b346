"""Webhooks: what a delivery carries, how it is signed, and where it may go.

Signatures follow the Standard Webhooks specification: a delivery is sent with the
headers `webhook-id` (the same on every attempt: receivers dedupe on it),
`webhook-timestamp` (Unix seconds of this attempt) and `webhook-signature`
(`v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`, keyed with the base64-decoded
part of the webhook's `whsec_` secret). The body is
`{"type": <notice kind>, "timestamp": ..., "data": <the notice>}`.

Targets: an operator restricts them with CONTEXTLOG_WEBHOOK_HOSTS (the host names
allowed; `*.example.com` for subdomains) and keeps addresses on loopback, private,
link-local and reserved networks refused unless CONTEXTLOG_WEBHOOK_ALLOW_PRIVATE is
true. Both are checked when a webhook is registered and again, on the resolved
addresses, before each attempt; a strict deployment also runs the worker behind an
egress proxy or firewall, since a name may resolve differently between check and connect.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import socket
from collections.abc import Callable, Sequence
from typing import Final
from urllib.parse import urlsplit

import msgspec

from contextlog.schema.notices import Notice

SECRET_PREFIX: Final = "whsec_"
TOLERANCE_S: Final = 300  # what receivers accept between the timestamp and their clock
Resolve = Callable[[str], Sequence[str]]


class TargetRefused(ValueError):
    """Raised when a URL is not an allowed webhook target; the message says why."""


class Payload(msgspec.Struct, frozen=True, kw_only=True):
    """The body of a delivery."""

    type: str
    timestamp: str
    data: Notice


def new_secret() -> str:
    """A fresh signing secret: `whsec_` and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value of one attempt."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify(secret: str, headers: dict[str, str], body: bytes, now: int) -> bool:
    """Whether a delivery's headers carry a valid signature of `body`, timestamped within
    TOLERANCE_S of `now` (what a receiver checks)."""
    msg_id = headers.get("webhook-id", "")
    stamp = headers.get("webhook-timestamp", "")
    if not msg_id or not stamp.isdigit() or abs(now - int(stamp)) > TOLERANCE_S:
        return False
    expected = sign(secret, msg_id, int(stamp), body).encode()
    offered = headers.get("webhook-signature", "").split()
    return any(hmac.compare_digest(expected, s.encode()) for s in offered)


def payload(notice: Notice) -> bytes:
    """The body delivered for a notice (kept as signed, byte for byte)."""
    stamp = notice.occurred_at.isoformat().replace("+00:00", "Z")
    return msgspec.json.encode(Payload(type=notice.kind, timestamp=stamp, data=notice))


def delivery_id(webhook_id: str, notice_id: str) -> str:
    """The `webhook-id` of a notice to a webhook: one per pair, forever."""
    digest = hashlib.sha256(f"{webhook_id}\x00{notice_id}".encode()).hexdigest()
    return f"msg_{digest[:32]}"


def _host_allowed(host: str, allowed: Sequence[str]) -> bool:
    if not allowed:
        return True
    for pattern in allowed:
        if pattern.startswith("*.") and host.endswith(pattern[1:]):
            return True
        if host == pattern:
            return True
    return False


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return not (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


def resolve(host: str) -> list[str]:
    """The addresses a host name resolves to (what a connection would use)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as e:
        raise TargetRefused(f"cannot resolve {host}: {e}") from None
    return sorted({str(info[4][0]) for info in infos})


def check_target(
    url: str, hosts: Sequence[str], allow_private: bool, lookup: Resolve = resolve
) -> None:
    """Refuse (`TargetRefused`) a URL that is not http(s), names a host outside `hosts`, or
    resolves to a non-public address while those are not allowed."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused(f"a webhook URL must be http:// or https:// with a host: {url!r}")
    if parts.username or parts.password:
        raise TargetRefused("a webhook URL must not carry credentials")
    host = parts.hostname.lower()
    if not _host_allowed(host, hosts):
        allowed = ", ".join(hosts)
        raise TargetRefused(f"{host} is not among CONTEXTLOG_WEBHOOK_HOSTS ({allowed})")
    if allow_private:
        return
    for address in lookup(host):
        if not _public(address):
            raise TargetRefused(
                f"{host} resolves to {address}, which is not a public address; set "
                "CONTEXTLOG_WEBHOOK_ALLOW_PRIVATE=true to allow such targets"
            )
