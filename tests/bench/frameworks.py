"""How `contextlog api`'s framework was chosen: `python -m tests.bench.frameworks`.

The same two endpoints (decode a posted message into a msgspec Struct and answer its id;
answer a 100-message context as JSON) on each candidate ASGI framework and server, each
in its own process, measured by one keep-alive client sending requests one after the
other, as a bot's turn does, in interleaved rounds (A B C A B C ...). Prints p50/p99 in
microseconds per candidate and endpoint. Not part of `make bench`: it needs the
candidates that were not chosen (`pip install starlette granian`).
"""

from __future__ import annotations

import http.client
import statistics
import subprocess
import sys
import time
from typing import Any

import msgspec

from tests.support.servers import free_port

ROUNDS = 5
PER_ROUND = 1000
BODY = msgspec.json.encode(
    {"agent": "a", "channel": "c", "role": "user", "content": "hello " * 40, "source": "s"}
)

APP = r"""
import msgspec
class Post(msgspec.Struct, kw_only=True):
    agent: str
    channel: str
    role: str
    content: str | list[dict]
    source: str | None = None
class Posted(msgspec.Struct):
    event_id: str
class Ctx(msgspec.Struct):
    messages: list[dict]
    token_estimate: int
CTX = Ctx([{"role": "user" if i % 2 == 0 else "assistant",
            "content": [{"type": "text", "text": "word " * 40}]} for i in range(100)], 1000)
"""

LITESTAR = (
    APP
    + r"""
from litestar import Litestar, get, post
@post("/v1/post", status_code=200)
async def do_post(data: Post) -> Posted:
    return Posted("0192f0c0-0000-7000-8000-000000000000")
@get("/v1/ctx")
async def ctx() -> Ctx:
    return CTX
app = Litestar([do_post, ctx], openapi_config=None)
"""
)

STARLETTE = (
    APP
    + r"""
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
dec = msgspec.json.Decoder(Post)
async def do_post(request):
    dec.decode(await request.body())
    return Response(msgspec.json.encode(Posted("0192f0c0-0000-7000-8000-000000000000")),
                    media_type="application/json")
async def ctx(request):
    return Response(msgspec.json.encode(CTX), media_type="application/json")
app = Starlette(routes=[Route("/v1/post", do_post, methods=["POST"]), Route("/v1/ctx", ctx)])
"""
)

CANDIDATES = {
    "litestar+uvicorn": (LITESTAR, "uvicorn"),
    "starlette+uvicorn": (STARLETTE, "uvicorn"),
    "litestar+granian": (LITESTAR, "granian"),
    "starlette+uvicorn/h11": (STARLETTE, "uvicorn-h11"),
}


def _serve(name: str, code: str, server: str, port: int) -> subprocess.Popen[bytes]:
    path = f"/tmp/contextlog_fw_{name.replace('+', '_').replace('/', '_')}.py"
    with open(path, "w") as f:
        f.write(code)
    module = path.rsplit("/", 1)[1][:-3]
    if server.startswith("uvicorn"):
        argv = [sys.executable, "-m", "uvicorn", f"{module}:app", "--port", str(port)]
        argv += ["--log-level", "warning"]
        if server == "uvicorn":
            argv += ["--loop", "uvloop", "--http", "httptools"]
        else:  # the pure-Python defaults
            argv += ["--loop", "asyncio", "--http", "h11"]
    else:
        argv = [sys.executable, "-m", "granian", "--interface", "asgi", f"{module}:app"]
        argv += ["--port", str(port), "--loop", "uvloop", "--log-level", "warning"]
    return subprocess.Popen(argv, cwd="/tmp")


def _ready(port: int) -> http.client.HTTPConnection:
    for _ in range(200):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/v1/ctx")
            conn.getresponse().read()
            return conn
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"no server on {port}")


def _round(conn: http.client.HTTPConnection, out: dict[str, list[float]]) -> None:
    headers = {"content-type": "application/json"}
    for _ in range(PER_ROUND):
        t0 = time.perf_counter()
        conn.request("POST", "/v1/post", BODY, headers)
        r = conn.getresponse()
        r.read()
        t1 = time.perf_counter()
        conn.request("GET", "/v1/ctx")
        conn.getresponse().read()
        t2 = time.perf_counter()
        assert r.status == 200, r.status
        out["post"].append((t1 - t0) * 1e6)
        out["ctx"].append((t2 - t1) * 1e6)


def main() -> int:
    procs: dict[str, Any] = {}
    conns: dict[str, http.client.HTTPConnection] = {}
    samples: dict[str, dict[str, list[float]]] = {n: {"post": [], "ctx": []} for n in CANDIDATES}
    try:
        for name, (code, server) in CANDIDATES.items():
            port = free_port()
            procs[name] = _serve(name, code, server, port)
            conns[name] = _ready(port)
        for name in CANDIDATES:  # warm up
            _round(conns[name], {"post": [], "ctx": []})
        for _ in range(ROUNDS):
            for name in CANDIDATES:
                _round(conns[name], samples[name])
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(10)
    for name, got in samples.items():
        cells = []
        for what, xs in got.items():
            q = statistics.quantiles(xs, n=100)
            cells.append(f"{what} p50 {q[49]:.0f} us p99 {q[98]:.0f} us")
        print(f"{name:20} " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
