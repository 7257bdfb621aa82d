"""How fast `cclctl diagnose hang` is at scale, and how much memory it takes.

1. Post-mortem: 512 rank dumps of 2,000 records each (written the way the telemetry hub
   writes them), loaded from a folder and diagnosed. The floor, measured in the same run,
   is a plain ``json.loads`` of every file: what any reader of these files pays at least.
2. Live: 10,000 ranks' status documents (as the store holds them), parsed by the same code
   as ``--store`` (cclctl.live) and diagnosed. Each status lists the world's 10,000 members,
   so the parse, not the engine, dominates there.

Times are wall clock (best of ``--repeat``); memory is the Python heap's peak under
tracemalloc (a separate run, since tracing slows things down) and the process's max RSS.
Prints; asserts nothing.

    python benchmarks/diagnose_scale.py [--ranks 512] [--records 2000] [--live 10000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cclctl.diagnose.engine import diagnose
from cclctl.diagnose_io.inputs import load_dumps
from cclctl.live.snapshot import parse
from cclctl.records import COMPLETED, CollectiveRecord, CommInfo, RankSnapshot

T0 = 1_700_000_000_000_000_000
NS = 1_000_000_000


def snapshot(rank: int, n: int, records: int, kind: str, members: list[int]) -> RankSnapshot:
    """Rank ``rank`` of a job hung at the last seq, where rank n // 3 never entered it."""
    comm = f"0:0-{n - 1}"
    behind = rank == n // 3
    done = records - 1
    ring = []
    if kind == "dump":
        for seq in range(1, done + 1):
            start = T0 - (records - seq) * 1_000_000
            ring.append(
                CollectiveRecord(
                    comm, seq, "all_reduce", "float32", 1 << 18, 1 << 20, algo="ring",
                    state=COMPLETED, start_ns=start, end_ns=start + 400_000, step=2 * n - 2,
                    steps=2 * n - 2,
                )
            )  # fmt: skip
    inflight = None
    if not behind:
        inflight = CollectiveRecord(
            comm, records, "all_reduce", "float32", 1 << 18, 1 << 20, algo="ring",
            start_ns=T0 - 30 * NS, waiting_on=(rank - 1) % n, waiting_for="recv",
        )  # fmt: skip
        ring.append(inflight)
    return RankSnapshot(
        kind=kind,
        job="bench",
        rank=rank,
        world_size=n,
        host=f"node-{rank // 8}",
        pid=10_000 + rank,
        time_ns=T0,
        comms={comm: CommInfo(members, done if behind else records, done)},
        records=ring,
        inflight=inflight,
        reason="watchdog: all_reduce timed out",
        counters={"collectives": done, "errors": 0, "retries": 0, "hangs": 1},
    )


def best(repeat: int, work: Callable[[], Any]) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        gc.collect()  # garbage of the previous step is not this step's cost
        start = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - start)
    return min(times), result


def heap_peak_mb(work: Callable[[], Any]) -> float:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def max_rss_mb() -> float:
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def post_mortem(ranks: int, records: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory(prefix="cclctl-bench-") as tmp:
        members = list(range(ranks))
        for rank in range(ranks):
            text = snapshot(rank, ranks, records, "dump", members).to_json()
            Path(tmp, f"cclctl-bench-rank{rank}.json").write_text(text)
        files = sorted(Path(tmp).iterdir())
        total = sum(f.stat().st_size for f in files) / 2**20
        print(f"post-mortem: {ranks} dumps x {records} records ({total:.0f} MiB on disk)")

        def floor() -> None:
            for f in files:
                json.loads(f.read_bytes())

        def load() -> Any:
            return load_dumps([tmp])

        def run() -> Any:
            inputs = load()
            return diagnose(inputs.snapshots, notes=inputs.notes)

        t_floor, _ = best(repeat, floor)
        t_load, inputs = best(repeat, load)
        t_engine, diag = best(repeat, lambda: diagnose(inputs.snapshots, notes=inputs.notes))
        print(f"  json.loads of every file (floor) {t_floor:7.2f} s")
        print(f"  load dumps (tail only)           {t_load:7.2f} s")
        print(f"  diagnose (engine)                {t_engine:7.2f} s")
        print(f"  load + diagnose                  {t_load + t_engine:7.2f} s")
        print(f"  heap peak, load + diagnose       {heap_peak_mb(run):7.1f} MiB")
        print(f"  verdict: {diag.verdicts[0].summary}")


def live(ranks: int, repeat: int) -> None:
    members = list(range(ranks))
    listing = {
        f"cclctl/bench/status/{r}": snapshot(r, ranks, 1, "status", members).to_json().encode()
        for r in range(ranks)
    }
    mib = sum(len(v) for v in listing.values()) / 2**20
    print(f"live: {ranks} statuses ({mib:.0f} MiB as the store holds them)")

    def fetched() -> Any:
        return parse("bench", "bench:0", listing)

    t_parse, statuses = best(repeat, fetched)
    snaps = list(statuses.statuses.values())
    t_engine, diag = best(repeat, lambda: diagnose(snaps, now_ns=T0 + NS))
    print(f"  parse statuses (as --store)      {t_parse:7.2f} s")
    print(f"  diagnose (engine)                {t_engine:7.2f} s")
    print(f"  parse + diagnose                 {t_parse + t_engine:7.2f} s")
    peak = heap_peak_mb(lambda: diagnose(snaps, now_ns=T0 + NS))
    print(f"  heap peak, diagnose              {peak:7.1f} MiB")
    print(f"  verdict: {diag.verdicts[0].summary}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=512, help="dumps to write and read")
    parser.add_argument("--records", type=int, default=2000, help="records per dump")
    parser.add_argument("--live", type=int, default=10_000, help="live statuses")
    parser.add_argument("--repeat", type=int, default=2, help="runs; the best is shown")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    post_mortem(args.ranks, args.records, args.repeat)
    live(args.live, args.repeat)
    print(f"max RSS of this process: {max_rss_mb():.0f} MiB")


if __name__ == "__main__":
    main()
