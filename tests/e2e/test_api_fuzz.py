"""Schemathesis fuzzes a running `contextlog api` (a real process, as in the Procfile) from
its own OpenAPI document: no 5xx but the documented 503s, and every response (status,
content type, headers, body) matches the document."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import msgspec
import pytest
import schemathesis
from schemathesis import checks
from schemathesis.specs.openapi import checks as openapi_checks

from tests.support import services
from tests.support.api import api_process, make_key

pytestmark = pytest.mark.e2e

# Bounds that keep a run short: waits are what the server does on purpose.
MAX_WAIT_S = 0.05
EXAMPLES = 30


@pytest.fixture(scope="module")
def live_api(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """A `contextlog api` process on a fresh database and the test Redis db; its URL and
    a key of every right for every agent."""
    redis_url = os.environ.get("REDIS_URL")
    client = services.redis_or_skip(redis_url)
    assert redis_url is not None
    services.flush_owned(client)
    services.truncate(database_url)
    token = make_key(database_url, ["*"], "post,read,sessions,admin")
    log = Path(tmp_path_factory.mktemp("api")) / "api.log"
    fast = {"CONTEXTLOG_API_RATE": "100000", "CONTEXTLOG_API_BURST": "100000"}
    try:
        with api_process(database_url, redis_url, log, **fast) as (url, _):
            yield url, token
    finally:
        services.flush_owned(client)
        client.close()


@pytest.fixture(scope="module")
def api_schema(live_api: tuple[str, str]) -> Any:
    return schemathesis.openapi.from_url(live_api[0] + "/v1/openapi.json")


# Every operation of the committed document (test_api checks it is the served one).
DOC = msgspec.json.decode((Path(__file__).resolve().parents[2] / "docs/openapi.json").read_bytes())
OPERATIONS = [op["operationId"] for path in DOC["paths"].values() for op in path.values()]


def documented_503(ctx: Any, response: Any, case: Any) -> bool | None:
    """Not a server error, except the documented, retryable 503 problems."""
    if response.status_code == 503 and response.json().get("type", "").endswith(
        ("/not-visible", "/unavailable")
    ):
        return None
    return checks.not_a_server_error(ctx, response, case)


CHECKS = [
    documented_503,
    openapi_checks.status_code_conformance,
    openapi_checks.content_type_conformance,
    openapi_checks.response_schema_conformance,
    openapi_checks.response_headers_conformance,
]


@pytest.mark.parametrize("operation_id", OPERATIONS)
def test_the_api_answers_every_request_as_documented(
    operation_id: str, api_schema: Any, live_api: tuple[str, str]
) -> None:
    """schemathesis's pytest plugin does not load under this pytest; its strategies are
    driven by hypothesis here instead, one operation at a time."""
    url, token = live_api
    operation = api_schema.find_operation_by_id(operation_id)

    @hypothesis.given(case=operation.as_strategy())
    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        derandomize=True,
        database=None,
    )
    def fuzz(case: Any) -> None:
        if isinstance(case.query, dict):
            for bounded in ("timeout", "wait"):
                if bounded in case.query:
                    case.query[bounded] = MAX_WAIT_S
            if operation_id == "streamNotifications":
                case.query["wait"] = MAX_WAIT_S
        case.call_and_validate(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, checks=CHECKS, timeout=30
        )

    fuzz()
