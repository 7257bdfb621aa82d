"""A rank of a training-like loop for benchmarks/slow_detection.py: compute, all_reduce,
then rank 0's stop flag by broadcast, until the file ``RELEASE`` exists.

The step computes ``STEP_S`` seconds (sleep, as a host thread waits for its GPU), with
``JITTER`` (a fraction) of uniform noise on every rank. The slow rank ``SLOW_RANK`` starts
being slow before its collective number ``SLOW_SEQ``: either CCLCTL_FAULT's slow plan does
it (the benchmark sets the plan), or, with ``SLOW_EXTRA``, the rank computes that fraction
more per step itself. Either way it writes the wall time of that moment (the fault's
start) to ``MARK``. Rank 0 prints one JSON line with the store once it has run a step.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

import numpy as np

import cclctl

#: a backstop for a job whose benchmark is gone (the benchmark sets it past its watch)
GIVE_UP_S = float(os.environ.get("GIVE_UP_S", "600"))


def main() -> int:
    comm = cclctl.init()
    step_s = float(os.environ.get("STEP_S", "0.02"))
    jitter = float(os.environ.get("JITTER", "0"))
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    slow_seq = int(os.environ.get("SLOW_SEQ", "0"))
    extra = float(os.environ.get("SLOW_EXTRA", "0"))
    buf = np.ones(int(os.environ.get("COUNT", str(1 << 16))), np.float32)
    stop = np.zeros(1, np.uint8)
    rng = random.Random(comm.rank)
    deadline = time.monotonic() + GIVE_UP_S
    calls = 0
    slowed = False
    while True:
        if comm.rank == slow_rank and not slowed and calls + 1 >= slow_seq > 0:
            with open(os.environ["MARK"], "w") as mark:
                mark.write(repr(time.time()))
            slowed = True
        compute = step_s * (1 + rng.uniform(-jitter, jitter))
        time.sleep(compute * (1 + extra) if slowed and extra else compute)
        buf.fill(1.0)
        comm.all_reduce(buf)
        calls += 1
        if calls == 1 and comm.rank == 0:
            print(json.dumps({"store": os.environ.get("CCLCTL_STORE", "")}), flush=True)
        if comm.rank == 0:
            stop[0] = os.path.exists(os.environ["RELEASE"]) or time.monotonic() > deadline
        comm.broadcast(stop, root=0)
        calls += 1
        if stop[0]:
            break
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
