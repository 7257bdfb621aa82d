"""cclctl (this tree and a baseline revision) against Open MPI and gloo, in paired rounds.

``peers.py`` keeps the best of a few passes, which on a machine other jobs load swings
with whatever ran beside each pass. Here every round starts each runtime once, in an
order that rotates every round (as ``paired.py`` does for its sides), and each round gives
one ratio per pair; the median over rounds is printed with a 95% bootstrap interval, so a
slow spell of the machine hits every side of a round alike. The baseline is cclctl as
committed at ``--baseline-rev`` (``git archive`` into a temporary folder, put first on the
ranks' ``PYTHONPATH``), so a change is measured against its parent in the same run.

    python benchmarks/peers_paired.py --baseline-rev HEAD~1 [--ranks 2] [--min 1M --max 64M]
        [--ops all_reduce] [--rounds 8] [--json out.json]

Each runtime's block is ``peers_worker.py``'s (best of ``--reps`` blocks of about 64 MiB,
the slowest rank's time). Ratios are of busbw (higher is faster for the first named).
It asserts nothing; the load on the machine is printed before and after (the cores two
busy processes get, and the load average).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from paired import bootstrap_median
from peers import (
    WORKER,
    _parse,
    effective_cores,
    parse_size,
    peers_available,
    run_gloo,
    run_mpi,
    sizes_between,
)

from cclctl.launch.launcher import launch

REPO = Path(__file__).resolve().parents[1]
#: (numerator, denominator) of every ratio printed.
PAIRS = (
    ("cclctl", "baseline"),
    ("cclctl", "openmpi"),
    ("baseline", "openmpi"),
    ("cclctl", "gloo"),
    ("baseline", "gloo"),
)


def export_tree(rev: str, into: str) -> str:
    """cclctl's package as committed at ``rev``, under ``into``; returns the folder."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "cclctl"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    return into


def importing_first(tree: str) -> str:
    """A ``PYTHONPATH`` under which the ranks import cclctl from ``tree`` (an
    :func:`export_tree`), ahead of this process' own ``PYTHONPATH``."""
    return os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")]))


def run_cclctl_tree(n: int, worker_args: list[str], tree: str | None) -> list[dict[str, Any]]:
    """cclctl over shared memory on plain buffers, from ``tree`` (None: this checkout)."""
    lines: list[str] = []
    env = {"CCLCTL_TRANSPORT": "auto"}
    if tree is not None:
        env["PYTHONPATH"] = importing_first(tree)
    result = launch(
        [sys.executable, WORKER, "--runtime", "cclctl", *worker_args],
        n,
        env=env,
        output=lambda rank, stream, line: lines.append(line) if stream == "stdout" else None,
        timeout_s=900,
    )
    if result.returncode:
        raise RuntimeError(f"cclctl ranks failed with exit code {result.returncode}")
    return _parse(lines)


def one_round(
    round_no: int, sides: list[str], n: int, worker_args: list[str], tree: str
) -> dict[str, dict[tuple[str, int], float]]:
    """Seconds per call of every side, by (op, size), in this round's rotated order."""
    shift = round_no % len(sides)
    got: dict[str, dict[tuple[str, int], float]] = {}
    for side in sides[shift:] + sides[:shift]:
        if side == "cclctl":
            rows = run_cclctl_tree(n, worker_args, None)
        elif side == "baseline":
            rows = run_cclctl_tree(n, worker_args, tree)
        elif side == "openmpi":
            rows = run_mpi(n, worker_args)
        else:
            rows = run_gloo(n, worker_args)
        got[side] = {(r["op"], r["size"]): r["seconds"] for r in rows if "seconds" in r}
    return got


def summarize(rounds: list[dict[str, dict[tuple[str, int], float]]]) -> list[dict[str, Any]]:
    """Per (op, size, pair): the median busbw ratio over rounds and its 95% interval."""
    out = []
    keys = sorted(set.intersection(*(set(r[s]) for r in rounds for s in r)))
    for op, size in keys:
        for a, b in PAIRS:
            if a not in rounds[0] or b not in rounds[0]:
                continue
            ratios = [r[b][(op, size)] / r[a][(op, size)] for r in rounds]
            low, high = bootstrap_median(ratios)
            out.append(
                {
                    "op": op,
                    "size": size,
                    "pair": f"{a}/{b}",
                    "ratio": statistics.median(ratios),
                    "ci_low": low,
                    "ci_high": high,
                    "gbs_" + a: size / statistics.median(r[a][(op, size)] for r in rounds) / 1e9,
                }
            )
    return out


def render(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'op':>11} {'size':>10} {'pair':>18} {'ratio':>7} {'95% CI':>16} {'GB/s':>7}"]
    for row in rows:
        a = row["pair"].split("/")[0]
        ci = f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
        lines.append(
            f"{row['op']:>11} {row['size']:>10} {row['pair']:>18} {row['ratio']:>7.3f}"
            f" {ci:>16} {row['gbs_' + a]:>7.2f}"
        )
    return "\n".join(lines)


def load_average() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline-rev", required=True, help="the git revision to compare with")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--min", default="1M")
    ap.add_argument("--max", default="64M")
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--ops", default="all_reduce")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--sides", default="cclctl,baseline,openmpi,gloo")
    ap.add_argument("--json", default="peers-paired.json")
    args = ap.parse_args()
    sizes = sizes_between(parse_size(args.min), parse_size(args.max), args.factor)
    worker_args = ["--ops", args.ops, "--sizes", ",".join(map(str, sizes))]
    worker_args += ["--reps", str(args.reps), "--latency-calls", "0"]
    available = peers_available()
    sides = [s for s in args.sides.split(",") if not available.get(s)]
    for s in set(args.sides.split(",")) - set(sides):
        print(f"# skipped {s}: {available[s]}", file=sys.stderr)
    load = {"cores_before": effective_cores(), "loadavg_before": load_average()}
    rounds = []
    with tempfile.TemporaryDirectory(prefix="cclctl-baseline-") as tmp:
        tree = export_tree(args.baseline_rev, tmp)
        for round_no in range(args.rounds):
            print(f"# round {round_no + 1}/{args.rounds}", file=sys.stderr, flush=True)
            rounds.append(one_round(round_no, sides, args.ranks, worker_args, tree))
    load |= {"cores_after": effective_cores(), "loadavg_after": load_average()}
    rows = summarize(rounds)
    print(f"# {args.ranks} ranks, {args.rounds} rounds, baseline {args.baseline_rev}; load {load}")
    print(render(rows))
    doc = {
        "schema": "cclctl.peers_paired/1",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "load": load,
        "rows": rows,
        "rounds": [{s: {f"{k[0]}/{k[1]}": v for k, v in r[s].items()} for s in r} for r in rounds],
    }
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
