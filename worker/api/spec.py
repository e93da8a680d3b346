"""The route table's shape, and the OpenAPI 3.1 document generated from it.

Each `Endpoint` names its handler, the right a key needs, and its body, query and
response types; msgspec generates their JSON Schemas (`schema_components`), so the
document and the code cannot disagree (`contract.py` writes it to the repository, and a
test fails when the committed one drifts).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from contextlog.worker.api.problems import MEDIA_TYPE, Problem

VERSION: Final = "1.0.0"
REF: Final = "#/components/schemas/{name}"
_PARAM = re.compile(r"{(\w+)}")
# Path parameters are names (agent, channel, ...) or ids; the pipeline checks them too.
PATH_SCHEMA: Final = {"type": "string", "minLength": 1, "maxLength": 200}


@dataclass(frozen=True)
class Endpoint:
    """One operation of the API."""

    method: str
    path: str
    name: str  # the operationId; the TypeScript client's method name
    handler: Callable[[Any], Awaitable[Any]]
    summary: str
    tag: str
    right: str | None  # None: no key needed
    body: Any = None
    query: Any = None
    response: Any = None
    status: int = 200
    stream: bool = False  # text/event-stream
    refusable: bool = False  # may answer 409 (a refused session request)
    findable: bool = False  # may answer 404 (a webhook or delivery it names is unknown)
    large: bool = False  # its body may be up to CONTEXTLOG_API_MAX_IMPORT
    agent_wide: bool = False  # scoped by agent only; the handler checks channels
    idempotent: bool = False  # takes an Idempotency-Key header


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {MEDIA_TYPE: {"schema": {"$ref": REF.format(name="Problem")}}},
    }


def _retry_after() -> dict[str, Any]:
    return {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}


def _responses(e: Endpoint) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if e.stream:
        out[str(e.status)] = {
            "description": "server-sent events: `id` the stream entry, `data` a Notice "
            "as JSON (`event: error` and a Problem if the server lost Redis)",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        }
    elif e.response is None:
        out[str(e.status)] = {"description": "done"}
    else:
        schema = {"$ref": REF.format(name=e.response.__name__)}
        out[str(e.status)] = {
            "description": "done",
            "content": {"application/json": {"schema": schema}},
        }
    if e.body is not None:
        out["400"] = _problem("the body is not JSON")
        out["413"] = _problem("the body is over the size limit, or an event over its cap")
    if e.right is not None:
        out["401"] = _problem("no key, an unknown key or a revoked one")
        out["403"] = _problem("the key lacks the right, or is not scoped to this agent/channel")
        out["429"] = {**_problem("over the key's request rate"), "headers": _retry_after()}
    if e.findable:
        out["404"] = _problem("no such webhook or delivery (for this key)")
    if e.refusable:
        out["409"] = _problem("refused by the library (`Refused`): an unknown session, ...")
    out["422"] = _problem("the request does not fit the contract (`EventRejected`, ...)")
    out["503"] = {
        **_problem("Postgres or Redis unreachable, or a wait_for event not stored in time"),
        "headers": _retry_after(),
    }
    return out


def _query_parameters(query: Any, components: dict[str, Any]) -> list[dict[str, Any]]:
    if query is None:
        return []
    schema = components.pop(query.__name__)
    required = set(schema.get("required", []))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": prop}
        for name, prop in schema["properties"].items()
    ]


def _operation(e: Endpoint, components: dict[str, Any]) -> dict[str, Any]:
    params = [
        {"name": p, "in": "path", "required": True, "schema": dict(PATH_SCHEMA)}
        for p in _PARAM.findall(e.path)
    ]
    params += _query_parameters(e.query, components)
    if e.idempotent:
        params.append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "description": "the request's external id when its body names none",
                "schema": {"type": "string", "minLength": 1, "maxLength": 150},
            }
        )
    if e.stream:
        params.append(
            {
                "name": "Last-Event-ID",
                "in": "header",
                "required": False,
                "description": "acknowledge the notices up to this id (a reconnect)",
                "schema": {"type": "string", "maxLength": 40},
            }
        )
    op: dict[str, Any] = {
        "operationId": e.name,
        "summary": e.summary,
        "tags": [e.tag],
        "parameters": params,
        "responses": _responses(e),
    }
    doc = (e.handler.__doc__ or "").strip()
    if doc:
        op["description"] = doc
    if e.right is not None:
        op["security"] = [{"apiKey": []}]
        op["x-contextlog-right"] = e.right
    if e.body is not None:
        ref = {"$ref": REF.format(name=e.body.__name__)}
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}
    return op


def document(endpoints: Sequence[Endpoint], extra: Sequence[Any] = ()) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `endpoints`; `extra` types are added to its schemas
    (what a stream's events carry)."""
    types = {Problem, *extra}
    for e in endpoints:
        types |= {t for t in (e.body, e.query, e.response) if t is not None}
    ordered = sorted(types, key=lambda t: t.__name__)
    _, components = msgspec.json.schema_components(ordered, ref_template=REF)
    paths: dict[str, dict[str, Any]] = {}
    for e in endpoints:
        paths.setdefault(e.path, {})[e.method.lower()] = _operation(e, components)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "contextlog",
            "version": VERSION,
            "description": "Conversation memory for LLM chat agents: post messages and "
            "commands, read a context ready for the Anthropic Messages API, manage "
            "saved sessions, follow notifications.",
        },
        "paths": paths,
        "components": {
            "schemas": dict(sorted(components.items())),
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a key made by `contextlog keys create` (clk_...)",
                }
            },
        },
    }


def dumps(doc: dict[str, Any]) -> bytes:
    """The document as committed: indented, keys in a stable order, a final newline."""
    return msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n"
