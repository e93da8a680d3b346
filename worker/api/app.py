"""The ASGI app: every request goes through one pipeline, in this order.

key (401) -> rate (429, per key) -> right and scope (403) -> path names (422) -> body
size (413) -> body and query against their types (400/422) -> handler -> JSON.

Whatever goes wrong becomes a problem detail (`problems.py`); a request never sees a
traceback. Handlers await the async reader and producer, and run blocking work (export,
import, status) in a worker thread: the event loop is never blocked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import psycopg
import redis
import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from contextlog.schema import codec
from contextlog.schema.errors import ContextlogError
from contextlog.worker.api import problems
from contextlog.worker.api.keys import ApiKey
from contextlog.worker.api.problems import ApiError
from contextlog.worker.api.services import Services
from contextlog.worker.api.spec import Endpoint

log = structlog.get_logger("contextlog.api")
JSON: Final = "application/json"
NAMES: Final = ("agent", "channel")


@dataclass
class Call:
    """One request, checked and decoded, as a handler gets it."""

    request: Request
    services: Services
    key: ApiKey | None
    path: dict[str, str]
    body: Any
    query: Any

    @property
    def agent(self) -> str:
        """The path's agent."""
        return self.path["agent"]

    @property
    def channel(self) -> str:
        """The path's channel."""
        return self.path["channel"]

    @property
    def api_key(self) -> ApiKey:
        """The request's key (endpoints that need one always have it)."""
        assert self.key is not None
        return self.key


def problem_response(e: ApiError) -> Response:
    """The response of an `ApiError`."""
    return Response(
        problems.encode(e.problem()),
        status_code=e.status,
        media_type=problems.MEDIA_TYPE,
        headers=e.headers(),
    )


def _path(request: Request) -> dict[str, str]:
    path = {k: str(v) for k, v in request.path_params.items()}
    for name, value in path.items():
        if not value or len(value) > 200 or codec.refused_in_name(value) is not None:
            raise ApiError(
                422,
                "invalid-request",
                f"path: {name} must be 1-200 characters, no control, format or separator "
                "characters",
                reason="invalid",
            )
    return path


async def _body(request: Request, limit: int) -> bytes:
    """The body, refused (413) past `limit` bytes whether or not Content-Length says so."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "body-too-large", f"the body is {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "body-too-large", f"the body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _query(request: Request, kind: Any) -> Any:
    if kind is None:
        if request.query_params:
            raise ApiError(422, "invalid-request", "query: this operation takes no parameters")
        return None
    try:
        return msgspec.convert(dict(request.query_params), kind, strict=False)
    except msgspec.ValidationError as e:
        raise problems.invalid(e, "query") from None


def _decode(data: bytes, kind: Any) -> Any:
    try:
        return msgspec.json.decode(data, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise problems.invalid(e, "body") from None
    except (UnicodeDecodeError, RecursionError) as e:
        raise ApiError(400, "malformed-request", f"body is not valid JSON: {e}") from None


async def _authorize(
    e: Endpoint, request: Request, services: Services, path: dict[str, str]
) -> ApiKey | None:
    """The request's key, after its rate, right and scope are checked.

    Before the query is parsed: a key of another agent hears 403, never what its query
    lacked. A channel scope reads the `channel` parameter as sent (a string either way).
    """
    if e.right is None:
        return None
    key = await services.keys.verify(request.headers.get("authorization"))
    services.limiter.check(key.key_id)
    key.check(e.right)
    agent = path.get("agent")
    if agent is None:
        return key
    if e.agent_wide:  # the handler narrows to the key's channels
        if not key.allows_agent(agent):
            raise ApiError(403, "forbidden", f"this key is not scoped to {agent}")
        return key
    key.check(e.right, agent, path.get("channel", request.query_params.get("channel")))
    return key


async def _run(e: Endpoint, request: Request, services: Services) -> Any:
    path = _path(request)
    key = await _authorize(e, request, services, path)
    query = _query(request, e.query)
    body = None
    if e.body is not None:
        limit = services.settings.api_max_import if e.large else services.settings.api_max_body
        body = _decode(await _body(request, limit), e.body)
    return await e.handler(Call(request, services, key, path, body, query))


def _respond(e: Endpoint, result: Any) -> Response:
    if isinstance(result, Response):
        return result
    if result is None:
        return Response(status_code=e.status)
    return Response(msgspec.json.encode(result), status_code=e.status, media_type=JSON)


def _route(e: Endpoint, services: Services) -> Route:
    async def endpoint(request: Request) -> Response:
        try:
            return _respond(e, await _run(e, request, services))
        except ApiError as err:
            return problem_response(err)
        except ContextlogError as err:
            return problem_response(problems.from_error(err))
        except (psycopg.OperationalError, redis.ConnectionError, redis.TimeoutError) as err:
            log.warning("a server is unreachable", operation=e.name, error=str(err))
            return problem_response(
                ApiError(
                    503,
                    "unavailable",
                    "Postgres or Redis cannot be reached; retry",
                    error="Unavailable",
                    retry_after=problems.RETRY_UNAVAILABLE_S,
                )
            )
        except Exception:
            # Deliberately broad: the client gets a problem detail, never a traceback;
            # the log gets the traceback.
            log.exception("request failed", operation=e.name)
            return problem_response(
                ApiError(500, "internal", "the request failed; see the server log")
            )

    return Route(e.path, endpoint, methods=[e.method], name=e.name)


def build_app(services: Services, endpoints: Sequence[Endpoint]) -> Starlette:
    """The app serving `endpoints` with `services` (opened and closed with the app)."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await services.open()
        try:
            yield
        finally:
            await services.close()

    async def not_found(request: Request, exc: Exception) -> Response:
        return problem_response(
            ApiError(404, "not-found", f"no such operation: {request.url.path}")
        )

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return problem_response(
            ApiError(
                405,
                "method-not-allowed",
                f"{request.method} is not an operation of {request.url.path}",
            )
        )

    return Starlette(
        routes=[_route(e, services) for e in endpoints],
        lifespan=lifespan,
        exception_handlers={404: not_found, 405: not_allowed},
    )
