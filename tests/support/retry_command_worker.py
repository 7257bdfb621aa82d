"""A rank of a job an operator retries: all_reduce after all_reduce, each result checked.

Every rank's input is whole numbers seeded by its rank (``retry_worker.rank_input``), so
each rank computes the exact sum itself and counts a result that differs. It prints
``ready <pid>`` once its first call completed, ``epoch <e>`` each time a retry renewed its
links, and at the end ``done <calls> <wrong> <epoch>``, once the file named by ``RELEASE``
exists on any rank (they agree with a small all_reduce after each call, so all stop after
the same one; a backstop of 90 s ends it otherwise, exit 1). A failed call prints
``failed <error>`` and exits 1.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from retry_worker import rank_input

import cclctl
from cclctl.errors import CclError

COUNT = int(os.environ.get("COUNT", str(1 << 20)))
BACKSTOP_S = 90.0


def main() -> int:
    release = os.environ["RELEASE"]
    comm = cclctl.init()
    x0 = rank_input(comm.rank, COUNT)
    inputs = [rank_input(r, COUNT).astype(np.float64) for r in range(comm.world_size)]
    want = np.sum(inputs, axis=0).astype(np.float32)
    buf = np.empty_like(x0)
    calls = wrong = 0
    epoch = comm.failure.epoch
    deadline = time.monotonic() + BACKSTOP_S
    stop = np.zeros(1, np.int32)
    while not stop[0]:
        if time.monotonic() > deadline:
            print("backstop", flush=True)
            return 1
        buf[:] = x0
        try:
            comm.all_reduce(buf)
        except CclError as exc:
            print(f"failed {type(exc).__name__}: {exc}", flush=True)
            return 1
        calls += 1
        wrong += int(not np.array_equal(buf, want))
        if calls == 1:
            print(f"ready {os.getpid()}", flush=True)
        if comm.failure.epoch != epoch:
            epoch = comm.failure.epoch
            print(f"epoch {epoch}", flush=True)
        stop[0] = os.path.exists(release)
        comm.all_reduce(stop, op="max")  # every rank stops after the same call
    print(f"done {calls} {wrong} {epoch}", flush=True)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
