"""A rank of a hung job for the Prometheus query tests: the last rank never enters a collective.

Every other rank waits for the file named by ``GO`` (so Prometheus scrapes the zero series
first), then enters one all_reduce that cannot complete; the watchdog (``CCLCTL_TIMEOUT``,
policy ``raise``) times it out. Then every rank waits for ``RELEASE`` and closes.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import cclctl
from cclctl.errors import CclError

GIVE_UP_S = 300  # a backstop for a rank whose test is gone: its launcher stops it long before


def wait_for_file(path: str) -> None:
    """Poll for the test's signal file (it decides when the next phase may start)."""
    deadline = time.monotonic() + GIVE_UP_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} never appeared")
        time.sleep(0.1)


def main() -> int:
    comm = cclctl.init()
    if comm.rank != comm.world_size - 1:
        wait_for_file(os.environ["GO"])
        try:
            comm.all_reduce(np.ones(1024, np.float32))
            print(f"rank {comm.rank}: the all_reduce completed", file=sys.stderr, flush=True)
            return 1
        except CclError as exc:
            print(f"rank {comm.rank}: {type(exc).__name__}", flush=True)
    wait_for_file(os.environ["RELEASE"])
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
