"""Telemetry on vs off, on real all_reduces between real processes (asserts nothing).

The ranks run short blocks of calls with telemetry attached ("on") and detached ("off" and
its control copy "off2"), paired round by round (see ``paired.py``). The goal from the
telemetry issue: at most 1% more time per collective from 1 MiB up, and at most 5 us at 8 B.

    python benchmarks/telemetry_on_off.py [--ranks 2] [--rounds 30] [--sizes 1048576]
                                          [--pin] [--json out.json]

Every block runs a multiple of ``FOLD_BATCH`` calls, so each "on" block holds the fold of
about as many records as it made. The fold runs once per ``FOLD_BATCH`` calls, at whichever
call's seq is a multiple of it; with blocks of 60 calls it landed in one "on" block of four,
and the median over rounds left it out (+2.0 us at 1 MiB, against +2.6 us with blocks of
256 calls, in the same session).

A 1 MiB call takes ~225 us here and telemetry ~2.5 us of it, so telling 1% from 2% takes a
few hundred rounds (``--rounds 400``: about two minutes per size).
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

#: bytes -> calls per block: multiples of FOLD_BATCH, so that every "on" block pays its share
#: of folds (see the module's docstring)
SIZES = {8: 8 * FOLD_BATCH, 1 << 20: FOLD_BATCH, 16 << 20: FOLD_BATCH}


def _rank_main(rounds: int, sizes: list[int], pin: bool) -> None:
    import numpy as np

    import cclctl

    if pin:  # before the runtime starts its threads, which inherit the mask
        pin_rank()
    comm = cclctl.init()
    telemetry = comm.tracer
    results: dict[int, dict[str, list[float]]] = {}
    for nbytes in sizes:
        calls = SIZES[nbytes]
        buf = np.zeros(max(nbytes // 4, 1), np.float32)  # sums of zeros never overflow
        for _ in range(max(3, calls // 10)):  # warm up: links, slots, caches
            comm.all_reduce(buf)

        def call_of(side: str, buf: np.ndarray = buf) -> Callable[[], object]:
            comm.tracer = telemetry if side == "on" else None
            return lambda: comm.all_reduce(buf)

        results[nbytes] = run_rounds(rounds, calls, call_of, comm.barrier)
    comm.tracer = telemetry
    comm.close()
    if comm.rank == 0:
        print(json.dumps({str(k): v for k, v in results.items()}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        choices=sorted(SIZES),
        default=sorted(SIZES),
        metavar="BYTES",
        help=f"message sizes to measure (of {', '.join(map(str, SIZES))}; default all)",
    )
    parser.add_argument("--json", type=Path, help="also write the summary here")
    parser.add_argument("--pin", action="store_true", help="pin rank i to core i")
    args = parser.parse_args()
    if "RANK" in os.environ:
        _rank_main(args.rounds, args.sizes, args.pin)
        return
    from cclctl.launch.launcher import launch

    out: list[str] = []
    result = launch(
        [sys.executable, __file__, "--rounds", str(args.rounds), "--sizes", *map(str, args.sizes)]
        + (["--pin"] if args.pin else []),
        args.ranks,
        capture_rank0_stdout=out.append,
    )
    if result.returncode != 0 or not out:
        sys.exit(f"benchmark ranks failed (exit {result.returncode})")
    summary = {size: summarize(times) for size, times in json.loads(out[-1]).items()}
    ranks = f"{args.ranks} ranks" + (", pinned" if args.pin else "")
    print(f"cclctl all_reduce, {ranks}, {args.rounds} rounds; medians over rounds")
    print(render(summary, "off", "on"))
    if args.json:
        doc = {"ranks": args.ranks, "pinned": args.pin, "sizes": summary}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
