"""Run the benchmarks: `python -m tests.bench.run [--events N] [--only NAME]` (`make bench`).

Each benchmark gets a fresh database (`contextlog_bench_<pid>`, created on the DATABASE_URL
server and dropped at the end) and the Redis db of REDIS_URL, flushed first, which is refused
when that database holds keys that no benchmark or test run wrote. Results go to
`bench/results/<name>.json`; BENCHMARKS.md is rebuilt from every result file.

To add a benchmark: write `run(env: BenchEnv) -> Result` in a module of tests/bench/ and
register it in `BENCHMARKS` below.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

import psycopg
import redis

from tests.bench import (
    cache,
    cluster,
    context,
    erase,
    http,
    idle,
    ingest,
    peers,
    replica,
    report,
    scale,
    search,
    sessions,
)
from tests.bench.harness import BenchEnv, BenchError, Benchmark, Result
from tests.support.services import NotOurs, create_database, drop_database, flush_owned

# Unique to the run: two runs at once never share (or drop) each other's database.
DATABASE = f"contextlog_bench_{os.getpid()}"

BENCHMARKS: dict[str, Benchmark] = {
    "cache": cache.run,
    "cluster": cluster.run,
    "ingest": ingest.run,
    "context": context.run,
    "http": http.run,
    "read_your_writes": context.run_read_your_writes,
    "sessions": sessions.run,
    "idle": idle.run,
    "peers": peers.run,
    "replica": replica.run,
    "scale": scale.run,
    "search": search.run,
    "search_ingest": search.run_ingest,
    "erase": erase.run,
}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m tests.bench.run", description=__doc__)
    p.add_argument("--events", type=int, help="workload size (default: each benchmark's own)")
    p.add_argument("--only", choices=sorted(BENCHMARKS), action="append", help="run only NAME")
    p.add_argument(
        "--no-save", action="store_true", help="print results; leave bench/results alone"
    )
    args = p.parse_args(argv)
    if args.events is not None and args.events < 1:
        p.error("--events must be at least 1")
    return args


def servers(env: Mapping[str, str]) -> tuple[str, str]:
    """DATABASE_URL and REDIS_URL, or a message saying how to get them."""
    database_url, redis_url = env.get("DATABASE_URL"), env.get("REDIS_URL")
    if not database_url or not redis_url:
        raise BenchError(
            "DATABASE_URL and REDIS_URL must be set; run `make bench`, which embeds servers "
            "for unset ones"
        )
    return database_url, redis_url


def check_servers(database_url: str, redis_url: str) -> None:
    """Fail early, with the variable to fix, when a server does not answer."""
    try:
        psycopg.connect(database_url, connect_timeout=5).close()
    except psycopg.OperationalError as e:
        raise BenchError(f"cannot reach Postgres at DATABASE_URL: {e}") from e
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError as e:
        raise BenchError(f"cannot reach Redis at REDIS_URL: {e}") from e
    finally:
        client.close()


def fresh(server_url: str, redis_url: str, events: int | None) -> BenchEnv:
    """A re-created benchmark database and a flushed Redis db."""
    url = create_database(server_url, DATABASE)
    client = redis.Redis.from_url(redis_url)
    try:
        flush_owned(client)  # refuses a database holding keys no benchmark or test wrote
    except NotOurs as e:
        raise BenchError(str(e)) from e
    finally:
        client.close()
    return BenchEnv(database_url=url, redis_url=redis_url, events=events)


def summary(r: Result) -> str:
    """One line per result for the terminal."""
    verdict = "meets" if r.ratio >= r.target else "BELOW"
    return (
        f"{r.name}: ours {r.ours:,.0f} {r.unit}, limit {r.limit:,.0f} {r.unit}, "
        f"ratio {r.ratio:.2f} ({verdict} target {r.target:.2f}); {r.extra}"
    )


def command_line(argv: Sequence[str]) -> str:
    """The command to quote with the results."""
    return "make bench" if not argv else "python -m tests.bench.run " + " ".join(argv)


def run(argv: Sequence[str]) -> int:
    """Run the selected benchmarks, save and summarise their results."""
    args = parse_args(argv)
    server_url, redis_url = servers(os.environ)
    check_servers(server_url, redis_url)
    machine = report.machine_info(server_url, redis_url)
    print(
        f"benchmarks on {machine['nproc']} CPUs, Postgres {machine['postgres']} "
        f"({machine['postgres_at']}), Redis {machine['redis']} ({machine['redis_at']})",
        flush=True,
    )
    saved = 0
    try:
        for name in args.only or sorted(BENCHMARKS):
            print(f"[{name}] database {DATABASE} re-created", flush=True)
            env = fresh(server_url, redis_url, args.events)
            result = BENCHMARKS[name](env)
            print(summary(result), flush=True)
            if not args.no_save:
                print(f"  wrote {report.save(result, machine, command_line(argv))}")
                saved += 1
    finally:
        drop_database(server_url, DATABASE)
        if saved:  # even when a later benchmark failed, its predecessors' rows count
            print(f"wrote {report.write_markdown()}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: a failed benchmark prints why and exits 1."""
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
