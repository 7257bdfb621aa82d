"""A rank of a training-like loop for the slow-job tests: compute, then all_reduce, until
released.

Each step computes for ``STEP_S`` seconds (``SLOW_EXTRA`` more on the ranks named in
``SLOW_RANKS``: a compute straggler), then all_reduces ``COUNT`` float32. With
``COMPUTE=busy`` the step spends CPU time (which a cgroup quota or busy neighbours
stretch); by default it sleeps, as a host thread waits for a GPU's kernels. ``OP=all_to_all``
exchanges instead of reducing: every rank talks to every other (links out of a host to
each rank of the other). Rank 0
decides when to stop (the file ``RELEASE`` exists) and tells the others through a
broadcast, so every rank stops after the same call. Prints one JSON line once it has run
its first step (``{"rank": r, "pid": p, "store": "host:port"}``), for the test to wait on.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import cclctl

GIVE_UP_S = 300  # a backstop for a job whose test is gone


def busy(seconds: float) -> None:
    """Spend ``seconds`` of this process's CPU time (a quota or a busy neighbour stretches
    the wall time it takes, as it would a real step's compute)."""
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        for i in range(2000):
            x += i * i


def main() -> int:
    comm = cclctl.init()
    step_s = float(os.environ.get("STEP_S", "0.02"))
    slow = {int(r) for r in os.environ.get("SLOW_RANKS", "").split(",") if r}
    extra = float(os.environ.get("SLOW_EXTRA", "0.3"))
    compute = step_s * (1 + extra) if comm.rank in slow else step_s
    work = busy if os.environ.get("COMPUTE") == "busy" else time.sleep
    buf = np.ones(int(os.environ.get("COUNT", str(1 << 16))), np.float32)
    exchange = np.empty_like(buf) if os.environ.get("OP") == "all_to_all" else None
    stop = np.zeros(1, np.uint8)
    deadline = time.monotonic() + GIVE_UP_S
    told = False
    while True:
        work(compute)
        buf.fill(1.0)  # a sum of ones, never an overflow however long it runs
        if exchange is not None:
            comm.all_to_all(buf, exchange)
        else:
            comm.all_reduce(buf)
        if not told:
            store = os.environ.get("CCLCTL_STORE", "")
            print(json.dumps({"rank": comm.rank, "pid": os.getpid(), "store": store}), flush=True)
            told = True
        if comm.rank == 0:
            stop[0] = os.path.exists(os.environ["RELEASE"]) or time.monotonic() > deadline
        comm.broadcast(stop, root=0)
        if stop[0]:
            break
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
