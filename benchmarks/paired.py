"""Paired A/B timing for "X on vs off" benchmarks on a shared, noisy machine.

Each round runs one short block of calls per side, in an order that rotates every round, so
slow spells of the machine hit every side alike and no side always goes first. A round
gives one ratio per side against the baseline from blocks run back to back; the median
over rounds is reported, with a 95% bootstrap interval over rounds. A second copy of the
baseline ("off2") is the control: its distance from "off" is the run's noise floor, printed
beside the overhead. A goal counts as shown only when the whole interval is within it.

Best-of-N blocks, which these benchmarks used first, swung by ±5% between runs here; the
paired medians agree between runs within the control's spread. Sides taking turns call by
call were tried too, and rejected: part of what telemetry costs is paid after its call
(cold records counted later, caches it filled) and landed on the next call, whichever side
that was: telemetry at 8 B read 1.0 us taking turns against 2.6 us in blocks.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable

#: The sides every benchmark runs: the baseline, the thing measured, and the A/A control.
SIDES = ("off", "on", "off2")


def pin_rank() -> None:
    """Pin this rank (``RANK`` in the environment) to core ``RANK`` modulo the cores, with
    every thread it starts afterwards (call it before the transport starts its threads).

    Ranks pinned one per core, as ``mpirun`` binds them by default, take the scheduler's
    migrations out of the noise: each rank keeps its core's caches between calls.
    """
    os.sched_setaffinity(0, {int(os.environ["RANK"]) % (os.cpu_count() or 1)})


def run_rounds(
    rounds: int,
    calls: int,
    call_of: Callable[[str], Callable[[], object]],
    line_up: Callable[[], None],
    cpu: dict[str, list[float]] | None = None,
    *,
    settle: Callable[[], None] | None = None,
    process_cpu: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """Seconds per call of every side's block in every round.

    ``call_of(side)`` prepares the side (attach or detach what is measured) and returns the
    call to time; ``line_up()`` runs untimed before each block (a barrier between ranks).
    ``settle()``, if given, runs inside every block's timing after its calls: it finishes
    work a side deferred past them (a background thread's), which would otherwise land in
    whichever block runs next, often another side's.
    With ``cpu`` given, the calling thread's CPU seconds per call of every block go there
    too: steadier than the wall clock where the call mostly waits (gloo's 8 B calls), and
    where what is measured runs in the calling thread. ``process_cpu`` gets the same for
    every thread of the process (the backend's, a background folder's).
    """
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    for clock in (cpu, process_cpu):
        if clock is not None:
            clock.update({side: [] for side in SIDES})
    for round_no in range(rounds):
        shift = round_no % len(SIDES)
        for side in SIDES[shift:] + SIDES[:shift]:
            call = call_of(side)
            line_up()
            p0 = time.process_time()
            c0 = time.thread_time()
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            if settle is not None:
                settle()
            times[side].append((time.perf_counter() - t0) / calls)
            if cpu is not None:
                cpu[side].append((time.thread_time() - c0) / calls)
            if process_cpu is not None:
                process_cpu[side].append((time.process_time() - p0) / calls)
    return times


def summarize(times: dict[str, list[float]]) -> dict[str, float]:
    """Medians of the per-call time and of the per-round differences and ratios to "off",
    with 95% bootstrap intervals of the overhead in percent (``ci_low_pct``/``ci_high_pct``)
    and in microseconds (``ci_low_us``/``ci_high_us``), and the same for the A/A control, so
    a claim can be read against its uncertainty."""
    off, on, off2 = times["off"], times["on"], times["off2"]
    pairs = list(zip(off, on, strict=True))
    ratios = [b / a for a, b in pairs]
    controls = [b / a for a, b in zip(off, off2, strict=True)]
    low, high = bootstrap_median(ratios)
    low_us, high_us = bootstrap_median([b - a for a, b in pairs])
    noise_low, noise_high = bootstrap_median(controls)
    return {
        "off_us": statistics.median(off) * 1e6,
        "on_us": statistics.median(on) * 1e6,
        "overhead_us": statistics.median(b - a for a, b in pairs) * 1e6,
        "overhead_pct": 100 * (statistics.median(ratios) - 1),
        "ci_low_pct": 100 * (low - 1),
        "ci_high_pct": 100 * (high - 1),
        "ci_low_us": low_us * 1e6,
        "ci_high_us": high_us * 1e6,
        "noise_pct": 100 * (statistics.median(controls) - 1),
        "noise_ci_low_pct": 100 * (noise_low - 1),
        "noise_ci_high_pct": 100 * (noise_high - 1),
    }


def bootstrap_median(values: list[float], draws: int = 2000, seed: int = 1) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval of the median of ``values`` (rounds resampled
    with replacement; a fixed seed, so one run's numbers print the same twice)."""
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def render(summary: dict[str, dict[str, float]], off: str = "off", on: str = "on") -> str:
    """The summary as a table, one row per size (bytes)."""
    lines = [
        f"{'size':>10} {off + ' (us)':>12} {on + ' (us)':>12} {'delta (us)':>11}"
        f" {'95% CI us':>18} {'delta %':>8} {'95% CI %':>16} {'A/A noise %':>12}"
    ]
    for size, s in summary.items():
        ci = f"[{s['ci_low_pct']:+.2f}, {s['ci_high_pct']:+.2f}]"
        ci_us = f"[{s['ci_low_us']:+.2f}, {s['ci_high_us']:+.2f}]"
        lines.append(
            f"{int(size):>10} {s['off_us']:>12.1f} {s['on_us']:>12.1f} {s['overhead_us']:>11.2f}"
            f" {ci_us:>18} {s['overhead_pct']:>7.2f}% {ci:>16} {s['noise_pct']:>11.2f}%"
        )
    return "\n".join(lines)
