"""Two or more trees of this repository, A/B: ingest's drain and the bot turn, interleaved.

    python -m tests.bench.trees [--rounds 4] [--events 100000] [--turns 200] BASE REV...

Not part of `make bench` (it checks out other commits): it answers "did this change of
the house move a path a user feels?" (issue 32.6). Each REV is checked out as a detached
git worktree in a temporary folder and measured by its own benchmark code, on the
servers of DATABASE_URL and REDIS_URL, in rounds that alternate the order (A B C, C B A,
...) so the machine's drift cancels:

- ingest: the `ingest` benchmark's drain of EVENTS filled events (one round of it: a real
  `contextlog ingest` process, then the raw COPY of what it stored), events/s;
- bot turn: the `peers` benchmark's turn of ours (post a user message, then `context`
  with `wait_for` it, read-your-writes checked) on four 100-message conversations, TURNS
  turns after 10 of warm-up, a reply posted after each; p50 and p99 in ms.

Each REV's figures are given as a ratio to BASE's of the same round; the headline is the
median round. The result goes to `bench/results/<--name>.json` and BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.bench import report
from tests.bench.harness import ROOT, BenchError, Result
from tests.bench.run import check_servers, servers

DESCRIPTION = (
    "Trees of this repository A/B (not in `make bench`: it checks out other commits): "
    "ingest's drain (one round of the `ingest` benchmark: a real `contextlog ingest`, "
    "events/s) and our bot turn (the `peers` benchmark's: post, then `context` with "
    "`wait_for`, on 100-message conversations), each tree measured by its own benchmark "
    "code in interleaved rounds (A B C, C B A, ...); every tree as a ratio to the first."
)

# Runs in a REV's worktree (cwd), with that tree's packages first on the path: only
# interfaces every measured tree has (ingest.run, peers._ours and Ours).
MEASURE = """
import json, os, statistics, sys, time
from tests.bench import ingest, peers
from tests.bench import run as R
from tests.support.services import drop_database

what, server, redis_url = sys.argv[1], os.environ["DATABASE_URL"], os.environ["REDIS_URL"]
events, turns = int(os.environ["TREES_EVENTS"]), int(os.environ["TREES_TURNS"])
env = R.fresh(server, redis_url, events if what == "ingest" else None)
try:
    if what == "ingest":
        ingest.ROUNDS = 1
        res = ingest.run(env)
        out = {"events_per_s": res.ours, "copy_per_s": res.limit}
    else:
        with peers._ours(env) as (ours, _):
            for c in range(4):
                ours.fill("turn", f"c{c}", 100)
            ours.wait_stored(1 + 400, 120)
            took = []
            for t in range(turns + 10):
                channel = f"c{t % 4}"
                start = time.perf_counter()
                ours.turn("turn", channel, f"turn {t}: " + "question words " * 10)
                if t >= 10:
                    took.append((time.perf_counter() - start) * 1000)
                ours.reply("turn", channel, "answer words " * 20)
                time.sleep(peers.THINK_SECONDS)
            took.sort()
            out = {"p50_ms": statistics.median(took), "p99_ms": took[int(0.99 * (len(took) - 1))]}
finally:
    drop_database(server, R.DATABASE)
print("TREES " + json.dumps(out), flush=True)
"""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.bench.trees", description=__doc__)
    p.add_argument("revs", nargs="+", metavar="REV", help="commits; the first is the base")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--events", type=int, default=100_000)
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--name", default="trees", help="the result's name (bench/results/NAME)")
    args = p.parse_args(argv)
    if len(args.revs) < 2:
        p.error("give a base and at least one other REV")
    return args


@contextmanager
def worktrees(revs: Sequence[str]) -> Iterator[dict[str, Path]]:
    """Each REV checked out, with a folder that imports `contextlog.*` from it."""
    with tempfile.TemporaryDirectory(prefix="contextlog-trees-") as tmp:
        made: dict[str, Path] = {}
        try:
            for rev in revs:
                tree = Path(tmp) / f"tree-{len(made)}"
                git("worktree", "add", "--detach", str(tree), rev)
                made[rev] = tree
                shim = tree.with_name(tree.name + "-path") / "contextlog"
                shim.mkdir(parents=True)
                (shim / "__init__.py").touch()  # a regular package: found before the venv's
                for part in ("schema", "producers", "worker"):
                    (shim / part).symlink_to(tree / part)
            yield made
        finally:
            for tree in made.values():
                git("worktree", "remove", "--force", str(tree))


def git(*args: str) -> None:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if done.returncode:
        raise BenchError(f"git {' '.join(args)}: {done.stderr.strip()}")


def measure(tree: Path, what: str, args: argparse.Namespace) -> dict[str, float]:
    env = {
        **os.environ,
        "PYTHONPATH": f"{tree.with_name(tree.name + '-path')}:{tree}",
        "TREES_EVENTS": str(args.events),
        "TREES_TURNS": str(args.turns),
    }
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, what],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("TREES ")]
    if done.returncode or not lines:
        raise BenchError(f"{what} in {tree} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    out: dict[str, float] = json.loads(lines[-1].removeprefix("TREES "))
    return out


def rounds(trees: dict[str, Path], args: argparse.Namespace) -> list[dict[str, Any]]:
    revs = list(trees)
    done: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = revs if r % 2 == 0 else revs[::-1]
        one: dict[str, Any] = {"order": order}
        for what in ("ingest", "turn"):
            for rev in order:
                one[f"{rev} {what}"] = measure(trees[rev], what, args)
        base = revs[0]
        for rev in revs[1:]:
            one[f"{rev} ingest ratio"] = ratio(one, rev, base, "ingest", "events_per_s")
            one[f"{rev} turn p50 ratio"] = ratio(one, rev, base, "turn", "p50_ms")
            one[f"{rev} turn p99 ratio"] = ratio(one, rev, base, "turn", "p99_ms")
        print(f"  round {r + 1}/{args.rounds}: {json.dumps(one)}", flush=True)
        done.append(one)
    return done


def ratio(one: dict[str, Any], rev: str, base: str, what: str, key: str) -> float:
    return round(float(one[f"{rev} {what}"][key]) / float(one[f"{base} {what}"][key]), 3)


def median(done: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(float(r[key]) for r in done), 3)


def result(done: list[dict[str, Any]], args: argparse.Namespace, names: list[str]) -> Result:
    base, others = args.revs[0], args.revs[1:]
    notes = []
    for rev, name in zip(others, names[1:], strict=True):
        ingest = [r[f"{rev} ingest ratio"] for r in done]
        p50 = [r[f"{rev} turn p50 ratio"] for r in done]
        notes.append(
            f"{name} over {names[0]}: ingest {median(done, f'{rev} ingest ratio'):.2f} "
            f"(rounds {', '.join(f'{x:.2f}' for x in ingest)}), bot turn p50 "
            f"{median(done, f'{rev} turn p50 ratio'):.2f} (rounds "
            f"{', '.join(f'{x:.2f}' for x in p50)}), p99 "
            f"{median(done, f'{rev} turn p99 ratio'):.2f}."
        )
    for rev, name in zip(args.revs, names, strict=True):
        notes.append(
            f"{name}: ingest "
            + ", ".join(f"{r[f'{rev} ingest']['events_per_s']:,.0f}" for r in done)
            + " events/s; turn p50 "
            + ", ".join(f"{r[f'{rev} turn']['p50_ms']:.2f}" for r in done)
            + " ms"
        )
    last = others[-1]
    return Result(
        name=args.name,
        unit="events/s",
        ours=statistics.median(r[f"{last} ingest"]["events_per_s"] for r in done),
        limit=statistics.median(r[f"{base} ingest"]["events_per_s"] for r in done),
        limit_label=f"ingest's drain in the base tree ({names[0]}), same rounds",
        target=0.95,
        extra=f"{names[-1]} / {names[0]}: turn p50 {median(done, f'{last} turn p50 ratio'):.2f}",
        description=DESCRIPTION,
        notes=notes,
        details={"revs": dict(zip(names, args.revs, strict=True)), "rounds": done},
    )


def short(rev: str) -> str:
    """The commit's short hash, as the notes name it."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", rev], capture_output=True, text=True
    )
    if out.returncode:
        raise BenchError(f"not a commit of this repository: {rev}")
    return out.stdout.strip()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        database_url, redis_url = servers(os.environ)
        check_servers(database_url, redis_url)
        names = [short(rev) for rev in args.revs]
        with worktrees(args.revs) as trees:
            done = rounds(trees, args)
        machine = report.machine_info(database_url, redis_url)
        command = "python -m tests.bench.trees " + " ".join(sys.argv[1:] if argv is None else argv)
        print(f"wrote {report.save(result(done, args, names), machine, command)}")
        print(f"wrote {report.write_markdown()}")
    except BenchError as e:
        print(f"trees: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
