"""The slowness signals on vs off, on real all_reduces between real processes (asserts
nothing): what the windows (each fold's records folded into them) and the per-peer wait
timing (around every block on a peer) add to a call, telemetry staying on in both.

The ranks run short blocks of calls with the signals attached ("on") and detached ("off"
and its control copy "off2"), paired round by round (see ``paired.py``). The goal from
issue #35: at most 1% more time per all_reduce at 1 MiB. ``--transport tcp`` measures the
TCP path (the drive loop's waits) instead of shared memory (the one-copy engine's).

    python benchmarks/signals_overhead.py [--ranks 4] [--rounds 60] [--sizes 8 1048576]
                                          [--transport auto|tcp] [--part both|windows|waits]
                                          [--pin] [--json out.json]

Every block runs a multiple of ``FOLD_BATCH`` calls, so each "on" block pays its share of
folds (where the windows take the records).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from paired import pin_rank, render, run_rounds, summarize

from cclctl.telemetry.recorder import FOLD_BATCH

#: bytes -> calls per block (multiples of FOLD_BATCH: see the module's docstring)
SIZES = {8: 4 * FOLD_BATCH, 1 << 20: FOLD_BATCH}


def _rank_main(rounds: int, sizes: list[int], pin: bool, part: str) -> None:
    import numpy as np

    import cclctl

    if pin:  # before the runtime starts its threads, which inherit the mask
        pin_rank()
    comm = cclctl.init()
    telemetry = comm.tracer
    windows, waits = telemetry.windows, telemetry.peer_waits

    def attach(on: bool) -> None:
        telemetry.windows = windows if on and part != "waits" else None
        telemetry.peer_waits = waits if on and part != "windows" else None
        comm.tracer = telemetry  # the communicator reads peer_waits as its tracer is set

    results: dict[int, dict[str, list[float]]] = {}
    for nbytes in sizes:
        calls = SIZES[nbytes]
        buf = np.zeros(max(nbytes // 4, 1), np.float32)  # sums of zeros never overflow
        for _ in range(max(3, calls // 10)):  # warm up: links, slots, caches
            comm.all_reduce(buf)

        def call_of(side: str, buf: np.ndarray = buf) -> Callable[[], object]:
            attach(side == "on")
            return lambda: comm.all_reduce(buf)

        results[nbytes] = run_rounds(rounds, calls, call_of, comm.barrier)
    attach(True)
    comm.close()
    if comm.rank == 0:
        print(json.dumps({str(k): v for k, v in results.items()}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        choices=sorted(SIZES),
        default=sorted(SIZES),
        metavar="BYTES",
        help=f"message sizes to measure (of {', '.join(map(str, SIZES))}; default all)",
    )
    parser.add_argument("--transport", choices=("auto", "tcp"), default="auto")
    parser.add_argument(
        "--part",
        choices=("both", "windows", "waits"),
        default="both",
        help="what 'on' attaches: the windows (folded records), the per-peer wait timing, or both",
    )
    parser.add_argument("--json", type=Path, help="also write the summary here")
    parser.add_argument("--pin", action="store_true", help="pin rank i to core i")
    args = parser.parse_args()
    if "RANK" in os.environ:
        _rank_main(args.rounds, args.sizes, args.pin, args.part)
        return
    from cclctl.launch.launcher import launch

    os.environ["CCLCTL_TRANSPORT"] = args.transport
    out: list[str] = []
    result = launch(
        [sys.executable, __file__, "--rounds", str(args.rounds), "--sizes", *map(str, args.sizes)]
        + ["--part", args.part]
        + (["--pin"] if args.pin else []),
        args.ranks,
        capture_rank0_stdout=out.append,
    )
    if result.returncode != 0 or not out:
        sys.exit(f"benchmark ranks failed (exit {result.returncode})")
    summary = {size: summarize(times) for size, times in json.loads(out[-1]).items()}
    ranks = f"{args.ranks} ranks, transport {args.transport}, part {args.part}"
    ranks += ", pinned" if args.pin else ""
    print(f"cclctl all_reduce, signals off vs on, {ranks}, {args.rounds} rounds; medians")
    print(render(summary, "off", "on"))
    if args.json:
        doc = {"ranks": args.ranks, "transport": args.transport, "part": args.part}
        doc["pinned"] = args.pin
        args.json.write_text(json.dumps({**doc, "sizes": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
