"""A rank that lets a failed collective's error out uncaught, as most training scripts do.

``ITERS`` all_reduces with ``PAUSE`` seconds between them, then a clean exit; the fault
comes from ``CCLCTL_FAULT``. No ``try``: what the rank prints when a call fails is whatever
cclctl's exception hook makes of the error.
"""

from __future__ import annotations

import os
import time

import numpy as np

import cclctl


def main() -> None:
    comm = cclctl.init()
    buf = np.ones(1024, np.float32)
    for _ in range(int(os.environ.get("ITERS", "8"))):
        time.sleep(float(os.environ.get("PAUSE", "0.05")))
        comm.all_reduce(buf)
    comm.close()


if __name__ == "__main__":
    main()
