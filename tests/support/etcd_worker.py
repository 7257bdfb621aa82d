"""A rank of a job whose store is an etcd cluster (``CCLCTL_STORE=etcd://...``).

Joins from the environment, all-reduces ``ITERS`` times and prints ``{"rank", "sum"}``;
then, each time the file ``$GO.<n>`` appears (n = 1, 2, ...), all-reduces once more and
prints ``{"rank", "round", "sum"}``; it leaves once ``$GO.stop`` appears.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import cclctl


def _reduce(comm: Any) -> float:
    x = np.full(256, comm.rank + 1, np.float32)
    comm.all_reduce(x)
    return float(x[0])


def main() -> int:
    go = os.environ["GO"]
    comm = cclctl.init()
    total = 0.0
    for _ in range(int(os.environ.get("ITERS", "5"))):
        total = _reduce(comm)
    print(json.dumps({"rank": comm.rank, "sum": total}), flush=True)
    round_no = 1
    deadline = time.monotonic() + 120
    while not Path(f"{go}.stop").exists() and time.monotonic() < deadline:
        if Path(f"{go}.{round_no}").exists():
            print(json.dumps({"rank": comm.rank, "round": round_no, "sum": _reduce(comm)}))
            sys.stdout.flush()
            round_no += 1
        time.sleep(0.02)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
