"""A rank of a job whose calls a link fault can leave many calls apart: ``ITERS`` calls of
``COUNT`` float32 elements, taken in turn from ``CALLS`` (``bcast``: a broadcast from rank
0 of that call's data; ``reduce``: a sum to rank 0; ``sum``: an all_reduce), one buffer
reused, as a training loop's would be. A run of broadcasts lets the ranks upstream of a cut
link finish calls the ranks downstream never got.

Each call's inputs are whole numbers drawn from a generator seeded by the call's index (and
the rank, for a reduce's or all_reduce's), so every sum is exact and a test can compute it.
After each call the rank prints ``result <i> <call> <sha256 of its result>`` (a reduce's at
the root only); at the end ``epoch <n>`` (how many retries renewed its links), closes (with
retry on, waiting for every rank to close and serving a retry meanwhile) and prints
``done``. A failed call prints ``failed <i> <error>`` and the rank exits 1.

With ``HOLD`` (a folder) and ``HOLD_RANK``, every other rank writes ``HOLD/<rank>_<i>``
once its call ``i`` returned, and rank ``HOLD_RANK`` waits before its call ``HOLD_AT``
until the files ``HOLD_FOR`` names (``<rank>_<i>,...``) are there: the others are then
as many calls ahead as the test wants, or closing.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import numpy as np

import cclctl
from cclctl.errors import CclError

ITERS = int(os.environ.get("ITERS", "20"))
COUNT = int(os.environ.get("COUNT", str(1 << 20)))  # 4 MiB of float32
CALLS = os.environ.get("CALLS", "bcast").split(",")


def call_input(i: int, rank: int, count: int) -> np.ndarray:
    """Rank ``rank``'s input to call ``i``: whole numbers in [-1000, 1000), exact in sums
    (a broadcast's is its root's)."""
    return np.random.default_rng([i, rank]).integers(-1000, 1000, count).astype(np.float32)


def _hold() -> None:
    """Wait until the other ranks returned from the calls ``HOLD_FOR`` names (at most 60 s:
    a test then fails on its results, never hangs)."""
    hold = Path(os.environ["HOLD"])
    files = [hold / name for name in os.environ["HOLD_FOR"].split(",")]
    end = time.monotonic() + 60
    while not all(f.exists() for f in files) and time.monotonic() < end:
        time.sleep(0.01)


def main() -> int:
    comm = cclctl.init()
    inputs = [[call_input(i, comm.rank, COUNT)] for i in range(ITERS)]  # before the loop
    buf = np.empty(COUNT, dtype=np.float32)
    out = np.empty_like(buf)
    holder, hold_at = int(os.environ.get("HOLD_RANK", "-1")), int(os.environ.get("HOLD_AT", "0"))
    for i in range(ITERS):
        if comm.rank == holder and i == hold_at:
            _hold()
        call = CALLS[i % len(CALLS)]
        buf[:] = inputs[i][0] if call != "bcast" or comm.rank == 0 else -7
        try:
            if call == "bcast":
                held = comm.broadcast(buf, 0)
            elif call == "reduce":
                held = comm.reduce(buf, "sum", 0, out)
            else:
                held = comm.all_reduce(buf)
        except CclError as exc:
            print(f"failed {i} {exc}", flush=True)
            return 1
        if holder >= 0 and comm.rank != holder:
            (Path(os.environ["HOLD"]) / f"{comm.rank}_{i}").touch()
        if call != "reduce" or comm.rank == 0:
            print(f"result {i} {call} {hashlib.sha256(held.tobytes()).hexdigest()}", flush=True)
    print(f"epoch {comm.failure.epoch}", flush=True)
    comm.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
