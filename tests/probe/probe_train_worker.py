"""A training-like rank that probes its job first, as a pre-flight between steps would
(``cclctl.probe.in_job.probe``), then steps (20 ms of "compute", an all_reduce of 256 KiB)
until rank 0 finds the file ``RELEASE`` and tells the others in a broadcast, so every rank
stops after the same call (or after 300 s, a backstop for a test that is gone). Rank 0
says ``probed`` on stderr once the probe is published."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import cclctl
from cclctl.probe.in_job import probe
from cclctl.probe.options import ProbeOptions

GIVE_UP_S = 300


def main() -> int:
    comm = cclctl.init()
    result = probe(comm, ProbeOptions(large=1 << 20, timeout_s=2))
    if result is not None:
        print(f"probed published={result.published}", file=sys.stderr, flush=True)
    buf = np.ones(1 << 16, np.float32)
    stop = np.zeros(1, np.uint8)
    deadline = time.monotonic() + GIVE_UP_S
    while not stop[0]:
        time.sleep(0.02)  # a step's compute, as a host thread waits for a GPU
        buf.fill(1.0)
        comm.all_reduce(buf)
        if comm.rank == 0:
            stop[0] = os.path.exists(os.environ["RELEASE"]) or time.monotonic() > deadline
        comm.broadcast(stop, root=0)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
