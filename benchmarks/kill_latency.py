"""Kill latency: from a SIGKILL of one rank to the last survivor's exception (asserts nothing).

Each trial starts an 8-rank job from the environment, as srun or mpirun start one, rank 0
hosting the store (benchmarks/kill_job.py; the benchmark is the ranks' parent, so no
launcher stands between the kill and the ranks). Every rank runs all_reduce after all_reduce
with no pause (benchmarks/kill_worker.py), so the job is inside a collective when the kill
lands (a survivor may still be finishing a call that needs nothing more from the killed
rank; it fails in the next, and the count of those is printed). Once every rank has run
``READY_AFTER`` calls, the benchmark waits a random 0-20 ms (so the kill lands anywhere in
a call), reads ``time.time_ns()`` and SIGKILLs one rank other than 0 (rank 1 to 7 in
turn). Each survivor reads ``time.time_ns()`` as its collective raises: one host, one
clock. A trial's latency is the slowest survivor's.

Printed per transport: p50, p99 and max over trials with 95% bootstrap intervals (trials
resampled), how many survivors' errors named the killed rank as dead, and where the time
went: from the kill to the revoke record (the first rank to see the death records it) and
from the record to the last survivor's exception. The target: p99 <= 250 ms.

    python benchmarks/kill_latency.py [--trials 20] [--transport both|auto|tcp] [--json F]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kill_job import KillJob
from quantiles import percentile

TARGET_P99_MS = 250.0
RANKS = 8
JITTER_S = 0.020
NAMES = {"auto": "shared memory", "tcp": "TCP"}


def bootstrap(values: list[float], q: float, rounds: int = 2000) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval of the ``q`` quantile of ``values`` (one per
    trial, resampled with replacement; a fixed seed, so a run prints the same twice)."""
    rng = random.Random(24)
    estimates = sorted(percentile(rng.choices(values, k=len(values)), q) for _ in range(rounds))
    return percentile(estimates, 0.025), percentile(estimates, 0.975)


def one_trial(transport: str, victim: int, rng: random.Random) -> dict[str, Any]:
    """Kill ``victim`` in a fresh job; the kill's time, the victim's pid and every
    survivor's ``RAISED`` record."""
    survivors = set(range(RANKS)) - {victim}
    with (
        tempfile.TemporaryDirectory() as tmp,
        KillJob(Path(tmp), RANKS, transport, job=f"kill{victim}-{time.monotonic_ns()}") as job,
    ):
        if not job.wait_for("running", set(range(RANKS)), timeout_s=120):
            raise SystemExit(f"the job did not start:\n{job.tail()}")
        time.sleep(rng.uniform(0, JITTER_S))  # the moment of the kill, not a synchronisation
        pid = job.procs[victim].pid
        kill_ns = job.kill(victim)
        if not job.wait_for("raised", survivors, timeout_s=60):
            missing = sorted(survivors - set(job.raised))
            raise SystemExit(f"ranks {missing} never raised:\n{job.tail()}")
        return {"victim": victim, "pid": pid, "kill_ns": kill_ns, "raised": dict(job.raised)}


def summarize(trial: dict[str, Any]) -> dict[str, Any]:
    """A trial's latency (ms, slowest survivor), its parts, and how many survivors named
    the killed rank dead."""
    kill_ns, raised = trial["kill_ns"], trial["raised"].values()
    named = re.compile(rf"rank {trial['victim']} \(pid {trial['pid']} on [^)]+\) died")
    records = [r["record"] for r in raised if r["record"]]
    first = min(records, key=lambda r: r["time_ns"]) if records else None
    last = max(r["raised_ns"] for r in raised)
    return {
        "victim": trial["victim"],
        "latency_ms": (last - kill_ns) / 1e6,
        "first_ms": (min(r["raised_ns"] for r in raised) - kill_ns) / 1e6,
        "record_ms": (first["time_ns"] - kill_ns) / 1e6 if first else None,
        "seen_by": first["seen_by"] if first else None,
        "via": first["via"] if first else None,
        "named": sum(bool(named.search(r["error"])) for r in raised),
        "survivors": len(trial["raised"]),
        "in_call": sum(r["entered_ns"] <= kill_ns for r in raised),
        "wrong": [r["error"] for r in raised if not named.search(r["error"])],
    }


def show_trial(no: int, s: dict[str, Any]) -> None:
    record = (
        f"record {s['record_ms']:.1f} ms (rank {s['seen_by']} via {s['via']})"
        if s["record_ms"] is not None
        else "no record"
    )
    print(
        f"trial {no:2d}: kill rank {s['victim']}: last survivor {s['latency_ms']:.1f} ms, "
        f"first {s['first_ms']:.1f} ms, {record}, {s['named']}/{s['survivors']} named it, "
        f"{s['in_call']} had entered their failing call before it",
        flush=True,
    )
    for error in s["wrong"]:
        print(f"    not naming it: {error}")


def report(transport: str, rows: list[dict[str, Any]]) -> None:
    late = [r["latency_ms"] for r in rows]
    p50, p99 = percentile(late, 0.50), percentile(late, 0.99)
    (p50_lo, p50_hi), (p99_lo, p99_hi) = bootstrap(late, 0.50), bootstrap(late, 0.99)
    named = sum(r["named"] for r in rows)
    total = sum(r["survivors"] for r in rows)
    recorded = [r["record_ms"] for r in rows if r["record_ms"] is not None]
    spread = [r["latency_ms"] - r["record_ms"] for r in rows if r["record_ms"] is not None]
    print(
        f"\n{NAMES[transport]}, {RANKS} ranks, {len(rows)} kills: last survivor p50 "
        f"{p50:.1f} ms (95% CI {p50_lo:.1f}-{p50_hi:.1f}), p99 {p99:.1f} ms "
        f"(95% CI {p99_lo:.1f}-{p99_hi:.1f}), max {max(late):.1f} ms; "
        f"target p99 <= {TARGET_P99_MS:.0f} ms: " + ("met" if p99 <= TARGET_P99_MS else "NOT met")
    )
    inside = sum(r["in_call"] for r in rows)
    print(
        f"survivors naming the killed rank dead: {named}/{total}; "
        f"had entered their failing call before the kill: {inside}/{total} (the others "
        "were still finishing a call that needed nothing more from the killed rank)"
    )
    if recorded:
        print(
            f"kill -> revoke record: median {statistics.median(recorded):.1f} ms, "
            f"max {max(recorded):.1f} ms; record -> last survivor: median "
            f"{statistics.median(spread):.1f} ms, max {max(spread):.1f} ms",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="kills per transport (20)")
    parser.add_argument("--transport", default="both", choices=("both", "auto", "tcp"))
    parser.add_argument("--json", type=Path, help="also write every trial's records here")
    args = parser.parse_args()
    transports = ["auto", "tcp"] if args.transport == "both" else [args.transport]
    rng = random.Random(24)
    every: dict[str, list[dict[str, Any]]] = {}
    for transport in transports:
        print(f"== {NAMES[transport]}", flush=True)
        every[transport], rows = [], []
        for no in range(args.trials):
            trial = one_trial(transport, 1 + no % (RANKS - 1), rng)
            every[transport].append(trial)
            rows.append(summarize(trial))
            show_trial(no, rows[-1])
        report(transport, rows)
    if args.json:
        args.json.write_text(json.dumps(every, indent=1))


if __name__ == "__main__":
    main()
