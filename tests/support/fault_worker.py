"""A rank of a fault-injection job: ``ITERS`` collectives of one kind, then a clean exit.

Between collectives each rank "computes" for ``PAUSE`` seconds, as a training step does, so
the statuses it publishes keep up with its progress before the fault strikes.

The fault itself comes from ``CCLCTL_FAULT`` (see cclctl/runtime/comm/faults.py);
``FAULT_BUFFERS=shared`` puts the buffers in ``comm.empty()`` (zero-copy). With
``HOLD_ON_ERROR=1`` a rank whose collective fails stays alive (as a training process stuck
in its error handling does), so the live diagnosis can still read its status.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np

import cclctl
from cclctl.errors import CclError
from cclctl.runtime.comm.communicator import Communicator

OP = os.environ.get("FAULT_OP", "all_reduce")
ITERS = int(os.environ.get("ITERS", "8"))
PAUSE = float(os.environ.get("PAUSE", "0.3"))
COUNT = 65536  # 256 KiB of float32: large enough to run zero-copy on shared buffers


def one(comm: Communicator, buf: np.ndarray, out: np.ndarray) -> None:
    if OP == "all_reduce":
        comm.all_reduce(buf)
    elif OP == "all_gather":
        comm.all_gather(buf, out)
    elif OP == "broadcast":
        comm.broadcast(buf, root=0)
    else:
        raise SystemExit(f"unknown FAULT_OP {OP!r}")


def main() -> int:
    comm = cclctl.init()
    if os.environ.get("FAULT_BUFFERS") == "shared":  # zero-copy: peers read these directly
        buf = comm.empty(COUNT, np.float32)
        buf[:] = 1
        out = comm.empty(COUNT * comm.world_size, np.float32)
    else:
        buf = np.ones(COUNT, np.float32)
        out = np.empty(COUNT * comm.world_size, np.float32)
    try:
        for _ in range(ITERS):
            time.sleep(PAUSE)
            one(comm, buf, out)
    except CclError as exc:
        print(f"rank {comm.rank} failed: {exc}", file=sys.stderr, flush=True)
        if os.environ.get("HOLD_ON_ERROR") == "1":  # until the test stops it (at most 5 min)
            threading.Event().wait(300)
        return 1
    print(f"rank {comm.rank} done", flush=True)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
