"""Hostile stream entries: hypothesis strategies over raw bytes, JSON shapes and broken
events, each with what ingest must do with it.

A `Raw` entry is XADDed as is (field `e`, or other fields) onto a shard stream, below the
producer's checks. What ingest must do with it is what the product's own gate says
(`codec.decode_fields`, the call ingest makes on every entry): refused entries
(`must_reject`) must be dead-lettered with a reason, accepted ones stored once. The
strategies only aim at shapes (garbage, a broken field, odd but perhaps valid); no second
copy of the contract's rules decides an outcome, so a draw the contract happens to accept
(a random text that parses as a date) cannot fail the run. Events that could be stored
belong to agent `fuzz`, one conversation each, so they never touch the load's order.

Add a shape: a strategy returning `Raw`, listed in `raw_entries()`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from contextlog.schema import codec, keys
from contextlog.schema.errors import EventRejected

FUZZ_AGENT = "fuzz"
SHARDS = 4
ENTRY_CAP = codec.DEFAULT_MAX_ENTRY_BYTES  # the stacks' ingests run with the default
EXTREME_DATES = (
    "9999-12-31T23:59:00Z",  # last activity + idle timeout overflows
    "9999-12-31T23:59:59.999999-14:00",  # after year 9999 once in UTC
    "0001-01-01T00:00:00+14:00",  # before year 1 once in UTC: broke `contextlog rebuild`
)
INVALID_UTF8 = (b"\xe9", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xc0\xaf")
REQUIRED = ("type", "event_id", "agent", "channel", "occurred_at", "role", "content")


@dataclass(frozen=True)
class Raw:
    """One stream entry as XADDed, what it is, and what the gate says of it."""

    label: str
    fields: dict[bytes, bytes]
    must_reject: bool  # the gate refuses it: it must be dead-lettered
    shard: int
    event_id: str | None = None  # the gate accepts it: this event must be stored once

    @classmethod
    def judged(cls, label: str, fields: dict[bytes, bytes], shard: int) -> Raw:
        """The entry with the outcome ingest's own gate gives it."""
        try:
            event = codec.decode_fields(fields, ENTRY_CAP)
        except EventRejected:
            return cls(label, fields, True, shard)
        return cls(label, fields, False, shard, str(event.event_id))

    def __repr__(self) -> str:  # hypothesis prints failing examples: keep them readable
        e = self.fields.get(b"e", b"")
        shown = e if len(e) <= 160 else e[:120] + b"...(%d bytes)" % len(e)
        return f"Raw({self.label}, shard={self.shard}, must_reject={self.must_reject}, {shown!r})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """What hypothesis's pretty printer shows: the short repr, not 2 MB of payload."""
        printer.text(repr(self))


def message(event_id: str, channel: str, **overrides: Any) -> dict[str, Any]:
    """A valid message event of agent `fuzz`, as a JSON-ready dict."""
    base: dict[str, Any] = {
        "type": "message.v1",
        "event_id": event_id,
        "agent": FUZZ_AGENT,
        "channel": channel,
        "occurred_at": "2026-01-02T03:04:05Z",
        "role": "user",
        "content": "hello",
    }
    return {**base, **overrides}


def _entry(label: str, event: dict[str, Any], data: bytes | None = None) -> Raw:
    """A Raw entry on the event's own shard (so a stored one keeps per-conversation order)."""
    shard = keys.shard_of(FUZZ_AGENT, str(event.get("channel", "")), SHARDS)
    payload = json.dumps(event).encode() if data is None else data
    return Raw.judged(label, {b"e": payload}, shard)


ids = st.builds(lambda: str(uuid.uuid4()))
channels = st.builds(lambda: f"f-{uuid.uuid4().hex[:12]}")
shards = st.integers(0, SHARDS - 1)
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def garbage(draw: st.DrawFn) -> Raw:
    """Bytes that are not JSON, or JSON that is not an event (no `type` a tag would match)."""
    data = draw(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
    return Raw.judged("garbage", {b"e": data}, draw(shards))


@st.composite
def wrong_fields(draw: st.DrawFn) -> Raw:
    """No `e` field, an empty one, or fields whose names are not UTF-8."""
    fields = draw(st.sampled_from([{b"x": b"1"}, {b"e": b""}, {b"\xff\xfe": b"{}"}, {b"E": b"{}"}]))
    return Raw.judged("wrong fields", fields, draw(shards))


@st.composite
def broken_message(draw: st.DrawFn) -> Raw:
    """A valid message with one thing broken that the contract forbids."""
    event = message(draw(ids), draw(channels))
    how = draw(st.sampled_from(["drop", "retype", "tag", "role", "event_id", "date", "nul"]))
    if how == "drop":
        del event[draw(st.sampled_from(REQUIRED))]
    elif how == "retype":
        name = draw(st.sampled_from(["agent", "channel", "role", "occurred_at", "event_id"]))
        event[name] = draw(st.none() | st.booleans() | st.integers() | st.lists(st.integers()))
    elif how == "tag":
        event["type"] = draw(st.text(max_size=20).filter(lambda t: not t.endswith(".v1")))
    elif how == "role":
        event["role"] = draw(st.text(max_size=10).filter(lambda r: r not in ("user", "assistant")))
    elif how == "event_id":
        event["event_id"] = draw(st.text(max_size=40))
    elif how == "date":
        event["occurred_at"] = draw(st.sampled_from(EXTREME_DATES) | st.text(max_size=30))
    else:
        text = draw(st.text(max_size=20))
        at = draw(st.integers(0, len(text)))
        event["content"] = text[:at] + "\u0000" + text[at:]
    return _entry(f"broken message ({how})", event)


@st.composite
def invalid_utf8(draw: st.DrawFn) -> Raw:
    """Well-formed JSON but for bytes in one string that are not UTF-8."""
    event = message(draw(ids), draw(channels), content="PLACEHOLDER")
    field = draw(st.sampled_from(["content", "agent", "channel"]))
    text = json.dumps(event).encode()
    target = b'"PLACEHOLDER"' if field == "content" else json.dumps(event[field]).encode()
    bad = draw(st.sampled_from(INVALID_UTF8))
    data = text.replace(target, target[:-1] + bad + b'"', 1)
    return _entry(f"invalid UTF-8 in {field}", event, data)


@st.composite
def deep_nesting(draw: st.DrawFn) -> Raw:
    """Nesting deeper than a recursive decoder or encoder survives: in a tool's input (an
    event the contract might accept), or as the whole entry (never an event)."""
    depth = draw(st.integers(500, 3000))
    if draw(st.booleans()):
        inner = "[" * depth + "]" * depth
        return Raw.judged(f"raw nesting {depth} deep", {b"e": inner.encode()}, draw(shards))
    event = message(draw(ids), draw(channels), role="assistant", content="PLACEHOLDER")
    block = '{"type":"tool_use","id":"t1","name":"deep","input":' + _nested(depth) + "}"
    data = json.dumps(event).encode().replace(b'"PLACEHOLDER"', f"[{block}]".encode())
    return _entry(f"tool input nested {depth} deep", event, data)


def _nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


@st.composite
def oversized(draw: st.DrawFn) -> Raw:
    """A message whose entry is over the size cap (or just under it: then it is valid)."""
    size = draw(st.sampled_from([ENTRY_CAP + 1, ENTRY_CAP * 2, ENTRY_CAP * 8]))
    event = message(draw(ids), draw(channels), content="x" * size)
    return _entry(f"{size}-byte content", event)


@st.composite
def odd_but_valid(draw: st.DrawFn) -> Raw:
    """Events with unknown extra fields, or extra stream fields next to `e`: a reader that
    allows for evolution may store them; either way, exactly one outcome."""
    event = message(draw(ids), draw(channels))
    event[draw(st.text(min_size=1, max_size=10).filter(lambda k: k not in event))] = draw(
        json_values
    )
    raw = _entry("unknown extra field", event)
    if draw(st.booleans()):
        return Raw.judged("extra stream field", {**raw.fields, b"x": b"y"}, raw.shard)
    return raw


def raw_entries() -> st.SearchStrategy[Raw]:
    """Every shape of hostile entry."""
    return st.one_of(
        garbage(),
        wrong_fields(),
        broken_message(),
        invalid_utf8(),
        deep_nesting(),
        oversized(),
        odd_but_valid(),
    )


def known_poison() -> list[Raw]:
    """The entries that crashed or wedged ingest when the fault campaign found them."""

    def ev(**kw: Any) -> dict[str, Any]:
        return message(str(uuid.uuid4()), f"known-{uuid.uuid4().hex[:8]}", **kw)

    utf8 = ev(content="PLACEHOLDER")
    deep_tool = ev(role="assistant", content="PLACEHOLDER")
    block = '{"type":"tool_use","id":"t1","name":"deep","input":' + _nested(990) + "}"
    return [
        _entry("content 'caf\\xe9'", utf8,
               json.dumps(utf8).encode().replace(b'"PLACEHOLDER"', b'"caf\xe9"')),
        _entry("tool input nested 990 deep", deep_tool,
               json.dumps(deep_tool).encode().replace(b'"PLACEHOLDER"', f"[{block}]".encode())),
        Raw.judged("raw entry nested 2,000 deep", {b"e": b"[" * 2000 + b"]" * 2000}, 0),
        Raw.judged("raw object nested 2,000 deep", {b"e": _nested(2000).encode()}, 1),
        *[_entry(f"occurred_at {d}", ev(occurred_at=d)) for d in EXTREME_DATES],
        _entry("NUL in content", ev(content="a\u0000b")),
        _entry("oversized content", ev(content="x" * (ENTRY_CAP + 1))),
    ]  # fmt: skip
