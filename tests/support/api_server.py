"""A real deployment for the TypeScript client's tests: `python -m tests.support.api_server`.

On DATABASE_URL's server it creates a fresh database, flushes REDIS_URL's database (only
if every key there is a test's), starts `contextlog ingest`, `worker` and `api` as the
Procfile does, makes keys, and prints one JSON line: {"url", "key", "narrow", "logs"}
(`key`: every right on every agent; `narrow`: post and read on agent `alpha` only). It
stops everything and drops the database when its standard input closes. Without the
servers it prints {"skip": reason} and exits 0 (under CI=true: 1).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from tests.support import services
from tests.support.api import api_process, make_key
from tests.support.processes import Process


def _skip(reason: str) -> int:
    print(json.dumps({"skip": reason}), flush=True)
    return 1 if services.IN_CI else 0


def main() -> int:
    base, redis_url = os.environ.get("DATABASE_URL"), os.environ.get("REDIS_URL")
    if not base or not redis_url:
        return _skip("DATABASE_URL and REDIS_URL are not set; run with `make test`'s servers")
    name = f"contextlog_ts_{os.getpid()}"
    try:
        database_url = services.create_database(base, name)
        client = services.redis_or_skip(redis_url)
        services.flush_owned(client)
    except BaseException as e:  # pytest's skip/fail outcomes and services.NotOurs alike
        return _skip(f"servers unusable: {e}")
    logs = Path(tempfile.mkdtemp(prefix="contextlog-ts-"))
    extra = {
        "CONTEXTLOG_BLOCK_MS": "50",
        "CONTEXTLOG_LOG_FORMAT": "console",
        "CONTEXTLOG_WEBHOOK_ALLOW_PRIVATE": "true",
        "CONTEXTLOG_API_RATE": "1000",
        "CONTEXTLOG_API_BURST": "1000",
    }
    try:
        # The api migrates the database before it answers; then ingest and worker.
        with api_process(database_url, redis_url, logs / "api.log", **extra) as (url, api):
            others = [Process(cmd, api.env, logs / f"{cmd}.log") for cmd in ("ingest", "worker")]
            try:
                for p in others:
                    p.start()
                key = make_key(database_url, ["*"], "post,read,sessions,admin")
                narrow = make_key(database_url, ["alpha"], "post,read")
                info = {"url": url, "key": key, "narrow": narrow, "logs": str(logs)}
                print(json.dumps(info), flush=True)
                sys.stdin.read()  # until the test closes it (or dies)
            finally:
                for p in others:
                    p.stop()
    finally:
        services.flush_owned(client)
        client.close()
        services.drop_database(base, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
