"""Benchmark results: one JSON file per benchmark, and BENCHMARKS.md rebuilt from all of them."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil  # type: ignore[import-untyped]  # no stubs in the dev dependencies
import psycopg
import redis

from tests.bench.harness import ROOT, Result

RESULTS_DIR = ROOT / "bench" / "results"
MARKDOWN = ROOT / "BENCHMARKS.md"
PG_SETTINGS = ("shared_buffers", "synchronous_commit", "fsync", "wal_level", "max_wal_size")


def where(url: str) -> str:
    """How a server is reached, without credentials: `tcp 127.0.0.1:5432` or `unix socket`."""
    parts = urlsplit(url)
    if parts.scheme == "unix" or not parts.hostname:
        return "unix socket"
    return f"tcp {parts.hostname}:{parts.port or ''}".rstrip(":")


def machine_info(database_url: str, redis_url: str) -> dict[str, Any]:
    """The machine and servers a result was measured on."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        pg = {
            name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
            for name in ("server_version", *PG_SETTINGS)
        }
    client = redis.Redis.from_url(redis_url)
    try:
        redis_version = str(client.info("server")["redis_version"])
    finally:
        client.close()
    return {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": _cpu_model(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "psycopg": f"{psycopg.__version__} ({psycopg.pq.__impl__}, libpq {psycopg.pq.version()})",
        "postgres": pg.pop("server_version"),
        "postgres_settings": pg,
        "postgres_at": where(database_url),
        "redis": redis_version,
        "redis_at": where(redis_url),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def save(result: Result, machine: dict[str, Any], command: str) -> Path:
    """Write `bench/results/<name>.json`; returns its path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    doc = {
        "name": result.name,
        "description": result.description,
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command,
        "machine": machine,
        "unit": result.unit,
        "ours": round(result.ours, 1),
        "limit": round(result.limit, 1),
        "limit_label": result.limit_label,
        "ratio": round(result.ratio, 3),
        "target": result.target,
        "extra": result.extra,
        "notes": result.notes,
        "details": result.details,
    }
    path = RESULTS_DIR / f"{result.name}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def load_all() -> list[dict[str, Any]]:
    """Every saved result, by benchmark name."""
    docs = [json.loads(p.read_text()) for p in sorted(RESULTS_DIR.glob("*.json"))]
    return sorted(docs, key=lambda d: str(d.get("name", "")))


def _rate(value: float, unit: str) -> str:
    return f"{value:,.0f} {unit}"


def markdown(docs: list[dict[str, Any]]) -> str:
    """BENCHMARKS.md: a row per benchmark, then what each one measures and where."""
    out = [
        "# Benchmarks",
        "",
        "Measured with `make bench` (runs `python -m tests.bench.run` under "
        "`contextlog.worker.dev.devenv`; "
        "`--only NAME` reruns one benchmark, `--events N` changes the workload size). "
        "This file is regenerated from `bench/results/*.json` on every run, so rows of "
        "benchmarks not rerun are kept. Ratio = ours / physical limit.",
        "",
        "| benchmark | ours | physical limit | ratio | target | meets target | extra | measured |",
        "|---|---:|---:|---:|---:|:---:|---|---|",
    ]
    for d in docs:
        m = d.get("machine", {})
        ratio, target = float(d["ratio"]), float(d["target"])
        out.append(
            f"| {d['name']} | {_rate(d['ours'], d['unit'])} | {_rate(d['limit'], d['unit'])} "
            f"| {ratio:.2f} | ≥ {target:.2f} | {'yes' if ratio >= target else '**no**'} "
            f"| {d.get('extra', '')} | {d['timestamp'][:10]}, {m.get('nproc')} CPUs, "
            f"Postgres {m.get('postgres')}, Redis {m.get('redis')} |"
        )
    for d in docs:
        m = d.get("machine", {})
        out += [
            "",
            f"## {d['name']}",
            "",
            d.get("description", ""),
            "",
            f"- Physical limit: {d.get('limit_label', '')}.",
            *(f"- {note}" for note in d.get("notes", [])),
            f"- Command: `{d.get('command', '')}` at {d['timestamp']}.",
            f"- Machine: {m.get('nproc')} CPUs ({m.get('cpu')}), {m.get('memory_gb')} GB, "
            f"{m.get('os')}; {m.get('python')}; psycopg {m.get('psycopg')}.",
            f"- Servers: Postgres {m.get('postgres')} ({m.get('postgres_at')}; "
            + ", ".join(f"{k}={v}" for k, v in m.get("postgres_settings", {}).items())
            + f"), Redis {m.get('redis')} ({m.get('redis_at')}).",
            f"- Details: `bench/results/{d['name']}.json`.",
        ]
    return "\n".join(out) + "\n"


def write_markdown() -> Path:
    """Regenerate BENCHMARKS.md from every saved result."""
    MARKDOWN.write_text(markdown(load_all()))
    return MARKDOWN
