"""How much telemetry adds to each collective, warm: start() and the folds, vs a no-op.

The runtime hands every record to ``start`` and sets its ``end_ns`` when it ends, so this
is the per-call tax of the observability layer with the caches on its side (after a large
reduction they are not: ``telemetry_on_off.py`` measures that). Records are built before
timing, as the runtime builds its record anyway. Prints numbers; asserts nothing.

    python benchmarks/telemetry_overhead.py [--calls N] [--comms K]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Protocol

from cclctl.config import RuntimeConfig
from cclctl.records import COMPLETED, CollectiveRecord
from cclctl.telemetry.hub import Telemetry
from cclctl.telemetry.recorder import FOLD_BATCH


class Sink(Protocol):
    start: Callable[[CollectiveRecord], None]

    def fold(self) -> None: ...


class NoOp:
    """The floor: a call that does nothing."""

    def start(self, rec: CollectiveRecord) -> None:
        pass

    def fold(self) -> None:
        pass


def records(n: int, comms: int) -> list[CollectiveRecord]:
    now = time.time_ns()
    return [
        CollectiveRecord(f"c{i % comms}", i + 1, "all_reduce", nbytes=1 << 20, start_ns=now + i)
        for i in range(n)
    ]


def per_call_us(sink: Sink, recs: list[CollectiveRecord]) -> float:
    """As the communicator drives it: start, the end, and a fold every FOLD_BATCH calls."""
    start, fold = sink.start, sink.fold
    t0 = time.perf_counter()
    for i, rec in enumerate(recs, 1):
        start(rec)
        rec.state = COMPLETED
        rec.end_ns = rec.start_ns + 250_000
        if i % FOLD_BATCH == 0:
            fold()
    return (time.perf_counter() - t0) / len(recs) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--comms", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cases: list[tuple[str, Sink]] = [
        ("no-op", NoOp()),
        ("telemetry, ring 2000", Telemetry(RuntimeConfig(), rank=0, world_size=8)),
        ("telemetry, ring off", Telemetry(RuntimeConfig(trace_buffer=0), rank=0, world_size=8)),
    ]
    best = {}
    for name, sink in cases:
        best[name] = min(
            per_call_us(sink, records(args.calls, args.comms)) for _ in range(args.repeat)
        )
    floor = best["no-op"]
    print(f"{'case':<24}{'us/collective':>15}{'over no-op':>12}")
    for name, us in best.items():
        print(f"{name:<24}{us:>15.3f}{us - floor:>12.3f}")


if __name__ == "__main__":
    main()
