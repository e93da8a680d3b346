"""A fake Anthropic Messages API: scripted in-process answers, and a real local HTTP server.

`FakeAPI` is a handler for `httpx2.MockTransport` (anthropic 2.x speaks `httpx2`, not `httpx`):
each request takes the next scripted `Outcome`, or the default once the script runs out.
`FakeAPIServer` serves successes over a real socket after a set latency, for tests and
benchmarks in other processes (point ANTHROPIC_BASE_URL at its `.url`).

    python -m tests.support.fake_anthropic --latency 0.2   # prints the URL, serves until ^C
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal

import anthropic
import httpx2

from tests.support import binding
from tests.support.anthropic_rules import check_params, check_request_messages

DEFAULT_TEXT = "The user and the assistant fixed the login bug; tests still need to be written."

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    529: "overloaded_error",
}

Kind = Literal[
    "ok", "status", "timeout", "disconnect", "invalid_json", "no_content", "reply", "stop"
]


@dataclass(frozen=True)
class Outcome:
    """One scripted answer: build them with the class methods."""

    kind: Kind
    text: str | None = DEFAULT_TEXT
    status: int = 200
    retry_after: float | None = None
    blocks: tuple[dict[str, Any], ...] = ()
    code: str | None = None  # an error's `error.details.error_code`

    @classmethod
    def ok(cls, text: str | None = DEFAULT_TEXT) -> Outcome:
        """A 200 with one text block (a compaction request: its summary; None: a
        compaction block with null content, the API's no-op)."""
        return cls("ok", text=text)

    @classmethod
    def reply(cls, *blocks: dict[str, Any]) -> Outcome:
        """A 200 with these content blocks (a `tool_use` ends with `stop_reason`
        "tool_use"); with thinking on, a signed thinking block comes first."""
        return cls("reply", blocks=blocks)

    @classmethod
    def stop(cls, reason: str) -> Outcome:
        """A compaction request answered without a block: `stop_reason` `reason`
        (max_tokens, refusal, tool_use, end_turn, model_context_window_exceeded)."""
        return cls("stop", text=reason)

    @classmethod
    def error(
        cls, status: int, *, retry_after: float | None = None, code: str | None = None
    ) -> Outcome:
        """An error status with the API's error body (and a `retry-after` header, an
        `error_code` such as `compaction_unavailable`, if given)."""
        return cls("status", status=status, retry_after=retry_after, code=code)

    @classmethod
    def timeout(cls) -> Outcome:
        """The read times out (httpx2.ReadTimeout, which the SDK turns into APITimeoutError)."""
        return cls("timeout")

    @classmethod
    def disconnect(cls) -> Outcome:
        """The connection fails (httpx2.ConnectError, the SDK's APIConnectionError)."""
        return cls("disconnect")

    @classmethod
    def invalid_json(cls) -> Outcome:
        """A 200 whose JSON body does not parse."""
        return cls("invalid_json")

    @classmethod
    def no_content(cls) -> Outcome:
        """A 200 with a JSON message that lacks `content`."""
        return cls("no_content")


def message_body(
    text: str,
    model: str,
    *,
    input_tokens: int = 10,
    content: list[dict[str, Any]] | None = None,
    stop_reason: str = "end_turn",
) -> dict[str, Any]:
    """A successful Messages API response body."""
    blocks = content if content is not None else [{"type": "text", "text": text}]
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": max(1, len(text) // 4)},
    }


def error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """The API's error envelope for `status` (with `error.details.error_code`)."""
    kind = _ERROR_TYPES.get(status, "api_error")
    error: dict[str, Any] = {"type": kind, "message": message}
    if code is not None:
        error["details"] = {"error_code": code}
    return {"type": "error", "error": error}


def _thinking_on(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def answer(body: dict[str, Any], outcome: Outcome, betas: str = "") -> tuple[int, dict[str, Any]]:
    """What the API answers a well-formed `body` with under `outcome` (a success kind):
    the prefix check on its thinking, then a reply (its thinking signed) or, for a
    compaction request, the compaction block."""
    if binding.enforced(body):
        checked = binding.check(body)
        if checked.invalid and not binding.drops(body):
            message = binding.error_message(checked, binding.BETA in betas)
            return 400, error_body(400, message)
        body = binding.without(body, checked.invalid)
    model = str(body["model"])
    if body.get("compaction") is not None:
        return 200, _compaction(body, outcome, model)
    content = [dict(b) for b in outcome.blocks] or [{"type": "text", "text": outcome.text or ""}]
    if _thinking_on(body):
        content = [{"type": "thinking", "thinking": "", "signature": ""}, *content]
        content = binding.sign(body, content, model)
    stop = "tool_use" if any(b.get("type") == "tool_use" for b in content) else "end_turn"
    text = "".join(str(b.get("text", "")) for b in content)
    return 200, message_body(text, model, content=content, stop_reason=stop)


def _compaction(body: dict[str, Any], outcome: Outcome, model: str) -> dict[str, Any]:
    """The on-demand compaction's answer: the block alone, `stop_reason` "compaction"
    (top-level usage 0, the cost in `usage.iterations`), or no block with another stop."""
    if outcome.kind == "stop":
        reply = message_body("", model, content=[], stop_reason=str(outcome.text))
        return reply
    summary = outcome.text if outcome.kind == "ok" else DEFAULT_TEXT
    block = binding.compaction_block(body, summary)
    reply = message_body("", model, content=[block], stop_reason="compaction")
    reply["usage"] = {
        "input_tokens": 0,
        "output_tokens": 0,
        "iterations": [{"type": "compaction", "input_tokens": 100, "output_tokens": 50}],
    }
    return reply


def _compaction_problems(body: dict[str, Any], betas: str) -> tuple[list[str], str | None]:
    """What the API refuses in a compaction request, and its error code."""
    if body.get("compaction") is None:
        return [], None
    if "compact-2026-09-04" not in betas:
        return ["compaction: requires anthropic-beta: compact-2026-09-04"], None
    if body.get("context_management") is not None:
        return ["compaction: cannot be combined with context_management"], None
    messages = body.get("messages") or []
    if not any(m.get("role") in ("user", "assistant") for m in messages):
        return ["messages holds nothing to summarize"], "compaction_nothing_to_summarize"
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    if last is messages[-1] and any(
        isinstance(b, dict) and b.get("type") == "tool_use" for b in last.get("content") or []
    ):
        return ["the last assistant turn ends in a tool call with no result"], (
            "compaction_incomplete_turn"
        )
    return [], None


def check_request(body: object) -> list[str]:
    """What makes `body` an invalid Messages request (empty when it is well formed)."""
    if not isinstance(body, dict):
        return ["body: must be a JSON object"]
    errors = []
    if not isinstance(body.get("model"), str) or not body["model"]:
        errors.append("model: a non-empty string is required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        errors.append("max_tokens: a positive integer is required")
    errors += check_params(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*errors, "messages: a non-empty list is required"]
    if not all(isinstance(m, dict) for m in messages):
        return [*errors, "messages: every message must be an object"]
    return errors + check_request_messages(body)


def _json_response(
    status: int, body: object, headers: dict[str, str] | None = None
) -> httpx2.Response:
    return httpx2.Response(status, json=body, headers=headers)


class FakeAPI:
    """Answers `POST /v1/messages` from a script; records every request body it parsed."""

    def __init__(self, *script: Outcome, default: Outcome | None = None) -> None:
        self.script = deque(script)
        self.default = default or Outcome.ok()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()

    def push(self, *outcomes: Outcome) -> None:
        """Queue more scripted answers."""
        with self._lock:
            self.script.extend(outcomes)

    @property
    def prompts(self) -> list[str]:
        """The text of each request's first user message."""
        return [_text(r["messages"][0]["content"]) for r in self.requests]

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        """The MockTransport handler."""
        if request.method != "POST" or request.url.path != "/v1/messages":
            return _json_response(404, error_body(404, f"no route {request.url.path}"))
        # anthropic 2.x sends the key as `Authorization: Bearer`; older clients used x-api-key.
        if not (request.headers.get("x-api-key") or request.headers.get("authorization")):
            return _json_response(401, error_body(401, "an API key is required"))
        try:
            body = json.loads(request.content)
        except ValueError:
            return _json_response(400, error_body(400, "request body is not valid JSON"))
        betas = request.headers.get("anthropic-beta", "")
        problems = check_request(body)
        more, code = _compaction_problems(body, betas) if isinstance(body, dict) else ([], None)
        problems += more
        with self._lock:
            self.requests.append(body)
            self.headers.append(dict(request.headers))
            if problems:  # a bad request is answered like the API would; the script waits
                return _json_response(400, error_body(400, "; ".join(problems), code))
            outcome = self.script.popleft() if self.script else self.default
        return _respond(outcome, request, body, betas)


def _respond(
    outcome: Outcome, request: httpx2.Request, body: dict[str, Any], betas: str = ""
) -> httpx2.Response:
    if outcome.kind == "timeout":
        raise httpx2.ReadTimeout("fake read timeout", request=request)
    if outcome.kind == "disconnect":
        raise httpx2.ConnectError("fake connection refused", request=request)
    if outcome.kind == "invalid_json":
        headers = {"content-type": "application/json"}
        return httpx2.Response(200, content=b'{"id": "msg_1", "content": [', headers=headers)
    if outcome.kind == "no_content":
        message = message_body("", body["model"])
        del message["content"]
        return _json_response(200, message)
    if outcome.kind == "status":
        headers = {} if outcome.retry_after is None else {"retry-after": f"{outcome.retry_after:g}"}
        error = error_body(outcome.status, f"fake {outcome.status}", outcome.code)
        return _json_response(outcome.status, error, headers)
    return _json_response(*answer(body, outcome, betas))


def _text(content: object) -> str:
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return str(content)


def client_for(fake: FakeAPI, *, timeout: float = 5.0) -> anthropic.Anthropic:
    """A real client whose requests go to `fake`; the SDK's own retries are off."""
    return anthropic.Anthropic(
        api_key="test-key",
        # Explicit, so an ANTHROPIC_BASE_URL in the environment cannot redirect the test.
        base_url="https://api.anthropic.com",
        max_retries=0,
        timeout=timeout,
        http_client=httpx2.Client(transport=httpx2.MockTransport(fake)),
    )


class FakeAPIServer:
    """A Messages API on 127.0.0.1 that answers every valid request after `latency` seconds."""

    def __init__(
        self,
        *,
        latency: float = 0.2,
        text: str = DEFAULT_TEXT,
        port: int = 0,
        drip: float | None = None,
    ) -> None:
        self.latency = latency
        self.drip = drip  # seconds between bytes: the whole answer, status line first
        self.text = text
        self._served = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="fake-anthropic", daemon=True
        )

    @property
    def requests_served(self) -> int:
        """How many successful answers were sent."""
        with self._lock:
            return self._served

    def start(self) -> FakeAPIServer:
        """Serve in a daemon thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()

    def __enter__(self) -> FakeAPIServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _count(self) -> None:
        with self._lock:
            self._served += 1

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                betas = self.headers.get("anthropic-beta", "")
                status, body = server._answer(self.path, self._body(), betas)
                payload = json.dumps(body).encode()
                if server.drip is not None:
                    self._drip(status, payload, server.drip)
                    return
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _drip(self, status: int, payload: bytes, every: float) -> None:
                head = (
                    f"HTTP/1.1 {status} OK\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(payload)}\r\n\r\n"
                ).encode()
                with contextlib.suppress(OSError):  # the client gave up: fine
                    for i in range(len(head + payload)):
                        self.wfile.write((head + payload)[i : i + 1])
                        self.wfile.flush()
                        time.sleep(every)
                self.close_connection = True

            def _body(self) -> object:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    return json.loads(raw)
                except ValueError:
                    return None

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the test output is not the place for an access log."""

        return Handler

    def _answer(self, path: str, body: object, betas: str = "") -> tuple[int, dict[str, Any]]:
        if path.split("?")[0] != "/v1/messages":
            return 404, error_body(404, f"no route {path}")
        problems = check_request(body)
        more, code = _compaction_problems(body, betas) if isinstance(body, dict) else ([], None)
        if problems or more:
            return 400, error_body(400, "; ".join(problems + more), code)
        assert isinstance(body, dict)
        time.sleep(self.latency)  # stands in for the model's latency, in the server's thread
        status, reply = answer(body, Outcome.ok(self.text), betas)
        if status == 200:
            self._count()
        return status, reply


def main() -> None:
    """Run a FakeAPIServer until interrupted, printing its URL for ANTHROPIC_BASE_URL."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with FakeAPIServer(latency=args.latency, port=args.port) as server:
        print(server.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
