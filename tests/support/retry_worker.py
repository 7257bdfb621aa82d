"""A rank of a retry job: ``ITERS`` in-place all_reduces of ``COUNT`` float32 elements.

Each rank's input is whole numbers drawn from a generator seeded by its rank, so the sum is
exact in any order and a test can compute it. Before each call the rank prints
``iter <i> <wall ns>``, after it ``digest <i> <sha256 of the result> <wall ns>`` (the times
just before the call and as it returned, so a benchmark times the call without this
process's hashing or the pipe; with ``HOLD`` one rank waits there for the test's word),
and after a call that was
retried ``rerun <i> <seq> <attempt> <start_ns>`` (its last attempt, from the flight
recorder); at the end its epoch (how many retries renewed its links) and ``done``. A failed
call prints ``failed <i> <sha256 of what the buffer holds> <error>``, so a test can tell the
input, the result and a mix apart.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time

import numpy as np

import cclctl
from cclctl.errors import CclError
from cclctl.runtime.comm.communicator import Communicator
from cclctl.telemetry.hub import Telemetry

ITERS = int(os.environ.get("ITERS", "4"))
COUNT = int(os.environ.get("COUNT", str(16 << 20)))  # 64 MiB of float32
#: with HOLD set, rank HOLD_RANK waits after printing ``iter <i>`` until ``$HOLD.<i>``
#: exists, so a test's fault lands before it enters the call, whatever the load
HOLD, HOLD_RANK = os.environ.get("HOLD", ""), int(os.environ.get("HOLD_RANK", "-1"))


def rank_input(rank: int, count: int) -> np.ndarray:
    """Rank ``rank``'s input: whole numbers in [-1000, 1000), exact in float32 sums."""
    return np.random.default_rng(rank).integers(-1000, 1000, count).astype(np.float32)


def _last_attempt(comm: Communicator) -> str:
    """``<seq> <attempt> <start_ns>`` of the latest attempt of the call just completed, from
    the rank's flight recorder: when its re-run began."""
    tracer = comm.tracer
    assert isinstance(tracer, Telemetry)
    rec = max(tracer.records(), key=lambda r: (r.seq, r.attempt, r.start_ns))
    return f"{rec.seq} {rec.attempt} {rec.start_ns}"


def _hold(path: str, within_s: float = 120.0) -> None:
    deadline = time.monotonic() + within_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)


def main() -> int:
    comm = cclctl.init()
    x0 = rank_input(comm.rank, COUNT)
    buf = np.empty_like(x0)
    epoch = comm.failure.epoch
    for i in range(ITERS):
        buf[:] = x0
        print(f"iter {i} {time.time_ns()}", flush=True)
        if HOLD and comm.rank == HOLD_RANK:
            _hold(f"{HOLD}.{i}")
        try:
            comm.all_reduce(buf)
            returned = time.time_ns()
        except CclError as exc:
            held = hashlib.sha256(buf.tobytes()).hexdigest()
            print(f"failed {i} {held} {exc}", flush=True)
            print(f"rank {comm.rank} failed: {exc}", file=sys.stderr, flush=True)
            return 1
        print(f"digest {i} {hashlib.sha256(buf.tobytes()).hexdigest()} {returned}", flush=True)
        if comm.failure.epoch != epoch:
            epoch = comm.failure.epoch
            print(f"rerun {i} {_last_attempt(comm)}", flush=True)
    print(f"epoch {comm.failure.epoch}", flush=True)
    comm.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
