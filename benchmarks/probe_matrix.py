"""Probe matrix: how long `cclctl probe` takes to measure every directed link of 8 ranks
(56 links, the circle method's 7 rounds), over shared memory and over two namespace hosts
(asserts nothing).

Shared memory: bare `cclctl probe -g 8` on this host. Two hosts: 4 ranks in each of two
network namespaces on a bridge (tests/probe/probe_hosts.py; root needed), shared memory
within a host and TCP across, one rank per host pair of 16 directed TCP links. Printed per
setting: the schedule's rounds, the time per round and the schedule's total as rank 0 timed
them, the whole command's wall time (start-up and join included), and the probe's median
bandwidth of each link kind, each the median over ``--trials``. The issue's target: the
56 links in 10 s or less.

    python benchmarks/probe_matrix.py [--trials 3] [-e 4M] [--no-hosts]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "tests" / "probe"))

TARGET_S = 10.0


def shared_memory(size: str) -> tuple[dict[str, object], float]:
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "cclctl", "probe", "-g", "8", "-e", size, "-J", "-"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    wall = time.monotonic() - t0
    if out.returncode not in (0, 3):
        raise SystemExit(f"probe exited {out.returncode}: {out.stderr}")
    return json.loads(out.stdout), wall


def two_hosts(size: str, port: int) -> tuple[dict[str, object], float]:
    from probe_hosts import BridgedHosts

    net = BridgedHosts(2)
    try:
        t0 = time.monotonic()
        result = net.probe(pathlib.Path(tempfile.mkdtemp()), port, "-e", size, per_host=4)
        wall = time.monotonic() - t0
    finally:
        net.close()
    if result.code not in (0, 3):
        raise SystemExit(f"probe exited {result.code}: {result.stderr}")
    return result.doc, wall


def summary(name: str, runs: list[tuple[dict[str, object], float]]) -> None:
    docs = [doc for doc, _ in runs]
    totals = [sum(doc["round_s"]) for doc in docs]  # type: ignore[arg-type]
    rounds = docs[0]["rounds"]
    per_round = [t / rounds for t in totals]  # type: ignore[operator]
    kinds: dict[str, list[float]] = {}
    for doc in docs:
        for kind, stats in doc["kinds"].items():  # type: ignore[attr-defined]
            kinds.setdefault(kind, []).append(stats["median"])
    flagged = [sum(1 for x in doc["links"] if x["flagged"]) for doc in docs]  # type: ignore[attr-defined]
    print(
        f"{name}: {len(docs[0]['links'])} links in {rounds} rounds; schedule "  # type: ignore[arg-type]
        f"{statistics.median(totals):.2f} s (median of {len(runs)}; "
        f"{statistics.median(totals) / TARGET_S:.2f} of the {TARGET_S:g} s target), "
        f"{statistics.median(per_round):.3f} s per round; command wall "
        f"{statistics.median([w for _, w in runs]):.2f} s; flagged per run {flagged}"
    )
    for kind, values in sorted(kinds.items()):
        print(f"  {kind}: median bandwidth {statistics.median(values) / 1e9:.3f} GB/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("-e", default="4M", help="the bandwidth message (cclctl probe -e)")
    parser.add_argument("--no-hosts", action="store_true", help="skip the namespace hosts")
    args = parser.parse_args()
    print(f"cclctl probe, 8 ranks, -e {args.e}, {os.cpu_count()} CPUs")
    summary("shared memory", [shared_memory(args.e) for _ in range(args.trials)])
    if not args.no_hosts and os.geteuid() == 0:
        runs = [two_hosts(args.e, 29790 + i) for i in range(args.trials)]
        summary("two namespace hosts (4 ranks each)", runs)


if __name__ == "__main__":
    main()
