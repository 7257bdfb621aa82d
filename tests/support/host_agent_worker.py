"""A rank of the host-agent tests: all_reduce in steps until the test releases the job.

Prints one JSON line when ready (its rank and the job's store). Every step all_reduces
whether rank 0 saw the release file, so every rank stops after the same step.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

import cclctl

comm = cclctl.init()
release = Path(os.environ["RELEASE"])
print(json.dumps({"rank": comm.rank, "store": os.environ["CCLCTL_STORE"]}), flush=True)
flag = np.zeros(1, dtype=np.int32)
while True:
    flag[0] = 1 if comm.rank == 0 and release.exists() else 0
    comm.all_reduce(flag)
    if flag[0]:
        break
    time.sleep(0.01)
comm.close()
