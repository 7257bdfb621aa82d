"""Instrumented vs plain gloo all_reduce, call by call: where in the distribution the cost
lands (asserts nothing).

Why: on this 2-vCPU machine gloo's 1 MiB all_reduce between 2 ranks is bimodal. About half
the calls take ~0.5 ms and the rest ~3.7 ms, call by call, pinned or not. A 40-call block's
mean then swings by ~12% with how many slow calls it happened to draw, and the paired
block medians of ``torch_overhead.py`` swing between runs by more than the 2% goal. Timing
every call shows what those means hide: how much the wrapper adds to a quick call and to a
slow one, and whether it makes slow calls more frequent.

The ranks run blocks of wrapped ("on") and plain ("off") calls and a second plain block
("off2", the A/A control), in an order that rotates every round, time every call, and end
each block with the session's fold, timed apart and charged to "on" (the wrapper defers
its bookkeeping to that fold; see ``torch_overhead.py``). That settle fold is one more
fold than a job makes, and a fold has a fixed cost of ~0.1-0.2 ms of cold code and data:
with 40-call blocks at 1 MiB it charged 8.9 us a call, with ``--calls 400`` 0.76 us, so
read the mean of both. Rank 0 reports:

- the shift function: each decile of "on" minus the same decile of "off", with 95%
  bootstrap intervals over blocks (deciles below the slow share are quick calls);
- the slow share of each side (calls above the split between the two modes, found by
  two-means clustering of log times) and the median of each mode;
- the mean per call with the fold charged, the figure a job feels, with its interval, and
  the control's (plain against plain): with gloo's two modes, means of tens of thousands
  of calls still drift apart (one run of 1,200 rounds: +0.34% [-0.67%, +1.68%]), and the
  control shows by how much in the run at hand.

    python benchmarks/torch_per_call.py [--size 1M] [--rounds 200] [--calls 40] [--pin]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time

from torch_overhead import start_instrumented_gloo

from cclctl.benchmark.sizes import parse_size

DECILES = range(1, 10)
TRACED = ("on",)  # the sides that record, each charged its own fold
NAMES = {"off": "plain", "off2": "plain 2", "on": "wrapped"}


def _rank_main(size: int, rounds: int, calls: int, pin: bool, data: str) -> None:
    import torch

    dist, plain, traced, sess = start_instrumented_gloo(pin)
    fns = {"on": traced, "off": plain, "off2": plain}
    sides = tuple(fns)
    t = torch.zeros(max(size // 4, 1), dtype=torch.float32)  # sums of zeros stay zero
    for _ in range(5):
        plain(t)
    clock = time.perf_counter_ns
    blocks: dict[str, list[list[int]]] = {side: [] for side in sides}
    folds: dict[str, list[int]] = {side: [] for side in TRACED if side in sides}
    for round_no in range(rounds):
        shift = round_no % len(sides)
        for side in sides[shift:] + sides[:shift]:
            fn = fns[side]
            dist.barrier()
            block = []
            for _ in range(calls):
                t0 = clock()
                fn(t)
                block.append(clock() - t0)
            t0 = clock()
            sess.fold()
            if side in folds:
                folds[side].append(clock() - t0)
            blocks[side].append(block)
    rank = dist.get_rank()
    dist.destroy_process_group()
    if rank == 0:  # a file, not stdout: the launcher passes a line over 1 MiB on in pieces
        with open(data, "w") as f:
            json.dump({"blocks": blocks, "folds": folds}, f)


def deciles(values: list[float]) -> list[float]:
    return statistics.quantiles(values, n=10, method="inclusive")


def split_point(values: list[float]) -> float:
    """The boundary between the two modes of ``values``: two-means clustering of their
    logarithms, the boundary halfway (in log) between the two centres."""
    logs = sorted(math.log(v) for v in values)
    low, high = logs[len(logs) // 10], logs[-len(logs) // 10 - 1]
    for _ in range(50):
        cut = (low + high) / 2
        below = [x for x in logs if x < cut] or [cut]
        above = [x for x in logs if x >= cut] or [cut]
        low, high = statistics.fmean(below), statistics.fmean(above)
    return math.exp((low + high) / 2)


def statistics_of(on: list[float], off: list[float]) -> list[float]:
    """The shift of each decile, then the difference of the means (wrapped minus plain)."""
    shifts = [a - b for a, b in zip(deciles(on), deciles(off), strict=True)]
    return [*shifts, statistics.fmean(on) - statistics.fmean(off)]


def bootstrap(
    on: list[list[float]], off: list[list[float]], draws: int = 400
) -> list[tuple[float, float]]:
    """95% percentile intervals of :func:`statistics_of`, over blocks resampled with
    replacement (a fixed seed: one run prints the same twice)."""
    rng = random.Random(1)
    samples = []
    for _ in range(draws):
        a = [x for block in rng.choices(on, k=len(on)) for x in block]
        b = [x for block in rng.choices(off, k=len(off)) for x in block]
        samples.append(statistics_of(a, b))
    intervals = []
    for column in zip(*samples, strict=True):
        ordered = sorted(column)
        intervals.append((ordered[int(0.025 * draws)], ordered[int(0.975 * draws) - 1]))
    return intervals


def report(data: dict[str, object], size: int, calls: int) -> None:
    blocks = data["blocks"]
    folds = data["folds"]
    assert isinstance(blocks, dict) and isinstance(folds, dict)
    sides = {
        side: [[x / 1e3 for x in b] for b in side_blocks] for side, side_blocks in blocks.items()
    }
    times = {side: [x for b in side_blocks for x in b] for side, side_blocks in sides.items()}
    traced = [side for side in TRACED if side in sides]
    off = times["off"]
    fold_us = {side: statistics.fmean(folds[side]) / 1e3 / calls for side in traced}
    intervals = {side: bootstrap(sides[side], sides["off"]) for side in traced}
    print(f"gloo all_reduce of {size} B, {len(sides['on'])} blocks of {calls} calls per side")
    for side in traced:
        print(f"shift function: decile of {NAMES[side]} minus decile of plain (us), 95% interval")
        for q, a, b, (low, high) in zip(
            DECILES, deciles(times[side]), deciles(off), intervals[side], strict=False
        ):
            print(
                f"  p{10 * q:<3} plain {b:9.1f}  wrapped {a:9.1f}"
                f"  {a - b:+8.1f} [{low:+.1f}, {high:+.1f}]"
            )
    cut = split_point(times["on"] + off)
    print(f"two modes, split at {cut:.0f} us:")
    for side in [side for side in NAMES if side in sides]:
        name = NAMES[side]
        values = times[side]
        quick = [x for x in values if x < cut] or [math.nan]
        slow = [x for x in values if x >= cut] or [math.nan]
        print(
            f"  {name:17} slow share {sum(x >= cut for x in values) / len(values):.3f};"
            f" median quick {statistics.median(quick):.1f} us,"
            f" slow {statistics.median(slow):.1f} us"
        )
    base = statistics.fmean(off)
    print(f"mean per call against plain ({base:.1f} us), 95% interval:")
    control = bootstrap(sides["off2"], sides["off"])[-1]
    rows = [(f"{NAMES[s]} + fold", s, fold_us[s], intervals[s][-1]) for s in traced]
    for name, side, charge, (low, high) in [*rows, ("plain 2 (A/A)", "off2", 0.0, control)]:
        delta = statistics.fmean(times[side]) - base + charge
        print(
            f"  {name:24} {delta:+7.1f} us ({100 * delta / base:+.2f}%)"
            f" [{100 * (low + charge) / base:+.2f}%, {100 * (high + charge) / base:+.2f}%]"
        )
    for side in traced:
        print(f"  (the fold: {fold_us[side]:.2f} us per call, {NAMES[side]})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--size", default="1M", help="message size, e.g. 8 or 1M")
    parser.add_argument("--rounds", type=int, default=200, help="blocks per side")
    parser.add_argument("--calls", type=int, default=40, help="calls per block")
    parser.add_argument("--pin", action="store_true", help="pin rank i to core i")
    parser.add_argument("--data", help=argparse.SUPPRESS)  # where rank 0 writes its timings
    args = parser.parse_args()
    size = parse_size(args.size, "--size")
    if "RANK" in os.environ:
        _rank_main(size, args.rounds, args.calls, args.pin, args.data)
        return
    from cclctl.launch.launcher import launch

    with tempfile.TemporaryDirectory(prefix="cclctl-per-call-") as tmp:
        data = os.path.join(tmp, "timings.json")
        argv = [sys.executable, __file__, "--size", str(size), "--rounds", str(args.rounds)]
        argv += ["--calls", str(args.calls), "--data", data] + (["--pin"] if args.pin else [])
        result = launch(argv, args.ranks, env={"PYTHONWARNINGS": "ignore"})
        if result.returncode != 0 or not os.path.exists(data):
            sys.exit(f"benchmark ranks failed (exit {result.returncode})")
        with open(data) as f:
            timings = json.load(f)
    report(timings, size, args.calls)


if __name__ == "__main__":
    main()
