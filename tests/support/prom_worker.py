"""A rank for the Prometheus end-to-end test: known collectives, then load until released.

Phase 1 does exactly ``GATHERS`` all_gathers (checked exactly through Prometheus); phase 2
runs all_reduces until the file named by ``RELEASE`` exists, so the live busbw query sees
traffic. Rank 0 decides when to stop and tells the others through a broadcast, so every rank
stops after the same call. Prints the number of all_reduces it ran.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import cclctl

GATHERS = 5
GATHER_COUNT = 1000  # float32 per rank
REDUCE_COUNT = 1 << 18  # 1 MiB of float32
GIVE_UP_S = 300  # a backstop for a job whose test is gone: its launcher stops it long before
RELEASED, GAVE_UP = 1, 2


def main() -> int:
    comm = cclctl.init()
    piece = np.ones(GATHER_COUNT, np.float32)
    out = np.empty(GATHER_COUNT * comm.world_size, np.float32)
    for _ in range(GATHERS):
        comm.all_gather(piece, out)
    buf = np.ones(REDUCE_COUNT, np.float32)
    stop = np.zeros(1, np.uint8)
    reduces = 0
    deadline = time.monotonic() + GIVE_UP_S
    while True:
        comm.all_reduce(buf)
        reduces += 1
        if comm.rank == 0:
            released = os.path.exists(os.environ["RELEASE"])
            stop[0] = RELEASED if released else GAVE_UP if time.monotonic() > deadline else 0
        comm.broadcast(stop, root=0)
        if stop[0]:
            break
    comm.close()
    print(f"all_reduces={reduces}", flush=True)
    return 0 if stop[0] == RELEASED else 1


if __name__ == "__main__":
    sys.exit(main())
