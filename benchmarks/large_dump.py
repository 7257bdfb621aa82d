"""Time and memory of reading one large dump, against reading it whole.

A dump is untrusted input up to ``cclctl.limits.MAX_FILE_BYTES`` (256 MiB). This writes a
valid dump of about ``--mb`` MB in the layout cclctl's writer uses (a long all_reduce ring,
and ``--groups`` sub-communicators each used once, early, so that their last calls lie deep
in the ring), then measures, each in a fresh process so that the peak RSS is its own:

- ``control``: ``json.loads`` of the whole file (what a plain reader pays at least);
- ``read_dump``: cclctl's reader (``cclctl.diagnose_io.dumpfile.read_dump``);
- ``diagnose``: ``cclctl diagnose hang`` on ``--copies`` such dumps (ranks 0..copies-1).

Prints wall seconds and max RSS (MB) per row; asserts nothing. To compare versions, run
it from outside the checkouts with ``PYTHONPATH=<a checkout>`` (the child processes import
cclctl from there, not from the current folder).

    python benchmarks/large_dump.py [--mb 240] [--groups 8] [--copies 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

T0 = 1_700_000_000_000_000_000
WORLD = "0:0-3"


def record(comm: str, seq: int, state: str = "completed") -> dict[str, object]:
    start = T0 + seq * 1_000_000
    return {
        "comm": comm, "seq": seq, "op": "all_reduce", "dtype": "float32", "count": 256,
        "nbytes": 1024, "root": None, "peer": None, "epoch": 0, "algo": "ring",
        "state": state, "start_ns": start, "end_ns": start + 400_000 if state != "started" else 0,
        "step": 6, "steps": 6, "waiting_on": None, "waiting_for": None, "error": None,
        "pg_name": "", "torch_seq": None, "attempt": 1,
    }  # fmt: skip


def write_dump(path: Path, rank: int, mb: int, groups: int) -> None:
    """A dump of rank ``rank`` of 4, hung in its last all_reduce, written record by record."""
    one = len(json.dumps(record(WORLD, 10**6), separators=(",", ":"))) + 1
    n = max(2, (mb << 20) // one)
    comms = {WORLD: {"ranks": "0-3", "last_started": n, "last_completed": n - 1}}
    for g in range(groups):
        comms[f"{g + 1}:0-1"] = {"ranks": "0-1", "last_started": 1, "last_completed": 1}
    last = record(WORLD, n, "started")
    head = {
        "schema": "cclctl.dump", "version": 1, "job": "big", "rank": rank, "world_size": 4,
        "host": "node-a", "pid": 1000 + rank, "time_ns": T0 + n * 1_000_000, "reason": "bench",
        "comms": comms, "inflight": last,
    }  # fmt: skip
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(head, separators=(",", ":"))[:-1] + ',"records":[')
        early = [
            json.dumps(record(f"{g + 1}:0-1", 1), separators=(",", ":")) for g in range(groups)
        ]
        fh.write(",".join(early))
        sep = "," if early else ""
        for seq in range(1, n):
            fh.write(sep + json.dumps(record(WORLD, seq), separators=(",", ":")))
            sep = ","
        fh.write(sep + json.dumps(last, separators=(",", ":")))
        fh.write('],"counters":{},"metrics_url":"","stacks":[]}')


def measure(code: str, *args: str) -> tuple[float, float, str]:
    """(wall s, max RSS MB, last line) of ``python -c code args`` in a fresh process."""
    wrapper = (
        "import resource, sys, time\n"
        "t = time.perf_counter()\n"
        f"{code}\n"
        "print(f'@@ {time.perf_counter() - t:.3f} "
        "{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", wrapper, *args], capture_output=True, text=True, check=False
    )
    lines = (out.stdout + out.stderr).strip().splitlines()
    mark = [line for line in lines if line.startswith("@@ ")]
    said = [line for line in lines if line.strip() and not line.startswith("@@ ")]
    if not mark:
        raise SystemExit(f"{code!r} failed: {lines[-1] if lines else out.returncode}")
    _, wall, rss = mark[-1].split()
    return float(wall), float(rss), said[-1] if said else ""


READ = (
    "from cclctl.diagnose_io.dumpfile import read_dump\n"
    "s = read_dump(sys.argv[1]); print(len(s.records), 'records kept')"
)
LOAD = "import json\nd = json.load(open(sys.argv[1], 'rb')); print(len(d['records']), 'records')"
DIAGNOSE = (
    "from cclctl.cli import main\n"
    "try:\n    main(['diagnose', 'hang', sys.argv[1]])\nexcept SystemExit as e:\n"
    "    print('exit', e.code)"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=240)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--copies", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for rank in range(args.copies):
            write_dump(folder / f"cclctl-big-rank{rank}.json", rank, args.mb, args.groups)
        one = str(folder / "cclctl-big-rank0.json")
        size = os.path.getsize(one) / 2**20
        print(f"dump: {size:.0f} MiB, {args.groups} groups; python {sys.version.split()[0]}")
        print(f"{'what':<34} {'wall s':>8} {'max RSS MB':>11}  result")
        for name, code, target in (
            ("control: json.load of one dump", LOAD, one),
            ("read_dump of one dump", READ, one),
            (f"diagnose hang, {args.copies} dumps", DIAGNOSE, str(folder)),
        ):
            wall, rss, said = measure(code, target)
            print(f"{name:<34} {wall:>8.2f} {rss:>11.0f}  {said[:60]}")


if __name__ == "__main__":
    main()
