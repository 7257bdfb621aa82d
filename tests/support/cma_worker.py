"""A rank that runs the single-copy collectives on plain buffers and reports what it got.

Prints one JSON line: ``{"rank", "transport", "algos", "results"}``, ``results`` mapping
each call's name to the hex SHA-256 of its result's bytes (``src_kept``: whether every
out-of-place call left its input as it was), or ``{"rank", "error", "message"}``.
``COUNT``: elements per rank (float32; odd, so the shares are uneven). ``LOOP=n``: first
all-reduce ``n`` times (a ``CCLCTL_FAULT`` may kill a rank meanwhile).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np

import cclctl
from cclctl.errors import CclError
from cclctl.records import CollectiveRecord
from cclctl.runtime.comm.tracing import Tracer


class Algos:
    """A tracer that keeps each call's algorithm and hands the record on to the rank's
    telemetry (whose watchdog expires a hung call)."""

    def __init__(self, telemetry: Tracer | None) -> None:
        self.algos: list[str] = []
        self.telemetry = telemetry

    def start(self, rec: CollectiveRecord) -> None:
        self.algos.append(rec.algo)
        if self.telemetry is not None:
            self.telemetry.start(rec)

    def fold(self) -> None:
        if self.telemetry is not None:
            self.telemetry.fold()


def inputs(rank: int, count: int) -> np.ndarray:
    """Rank ``rank``'s input: seeded, with signed zeros and NaNs where ranks differ."""
    x = np.random.default_rng(rank).standard_normal(count).astype(np.float32)
    x[::5] = np.float32(-0.0 if rank % 2 else 0.0)
    if rank == 0:
        x[3::7] = np.float32(np.nan)
    return x


def digest(arr: np.ndarray) -> str:
    return hashlib.sha256(arr.tobytes()).hexdigest()


def run(comm: cclctl.Communicator, count: int) -> tuple[dict[str, str], bool]:
    r, n = comm.rank, comm.world_size
    x = inputs(r, count)
    got: dict[str, str] = {}
    y = x.copy()
    comm.all_reduce(y)
    got["all_reduce_sum_in_place"] = digest(y)
    kept = True
    for op in ("max", "min"):
        src = x.copy()
        got[f"all_reduce_{op}"] = digest(comm.all_reduce(src, out=np.empty_like(src), op=op))
        kept &= src.tobytes() == x.tobytes()
    big = np.empty(count * n, np.float32)
    got["all_gather"] = digest(comm.all_gather(x, big))
    slot = big.copy()
    slot[r * count : (r + 1) * count] = x
    comm.all_gather(slot[r * count : (r + 1) * count], slot)
    got["all_gather_in_place"] = digest(slot)
    tiled = np.concatenate([inputs(r + 10 * j, count) for j in range(n)])
    got["reduce_scatter"] = digest(comm.reduce_scatter(tiled, np.empty(count, np.float32)))
    in_place = tiled.copy()
    comm.reduce_scatter(in_place, in_place[r * count : (r + 1) * count])
    got["reduce_scatter_in_place"] = digest(in_place[r * count : (r + 1) * count])
    mixed = np.concatenate([inputs(r + 100 * j, count) for j in range(n)])  # block j: to rank j
    got["all_to_all"] = digest(comm.all_to_all(mixed, np.empty_like(mixed)))
    in_place = mixed.copy()
    comm.all_to_all(in_place, in_place)
    got["all_to_all_in_place"] = digest(in_place)
    ints = (np.arange(count, dtype=np.int64) % 5) + r + 1
    comm.all_reduce(ints, op="prod")
    got["all_reduce_prod_int64"] = digest(ints)
    return got, kept


def main() -> int:
    comm = cclctl.init()
    tracer = Algos(comm.tracer)
    comm.tracer = tracer
    count = int(os.environ.get("COUNT", "300007"))
    try:
        loop = np.ones(count, np.float32)
        for _ in range(int(os.environ.get("LOOP", "0"))):
            comm.all_reduce(loop)
        results, kept = run(comm, count)
    except CclError as exc:
        failed = {"rank": comm.rank, "error": type(exc).__name__, "message": str(exc)}
        print(json.dumps(failed), flush=True)
        return 1
    report = {
        "rank": comm.rank,
        "transport": comm.transport.name,
        "algos": sorted(set(tracer.algos)),
        "results": results,
        "src_kept": kept,
    }
    comm.close()
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
