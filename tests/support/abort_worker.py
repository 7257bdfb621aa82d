"""A rank of a job an operator aborts: all_reduce after all_reduce until its communicator is
revoked, then one ``ABORTED <time_ns> <error type>: <message>`` line on stderr.

It prints one JSON line on stdout once it has run a collective (rank, pid, store, job), so
the test knows the job runs mid-call. After the abort it holds until the file named by its
first argument exists (at most 60 s), so the launcher stops no rank before every rank has
reported, and then exits 0. A rank that is never aborted gives up after 60 s (exit 1).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import cclctl
from cclctl.errors import CommAborted

BACKSTOP_S = 60.0


def main() -> int:
    release = sys.argv[1]
    comm = cclctl.init()
    buf = np.ones(4096, np.float32)
    comm.all_reduce(buf)
    ready = {
        "rank": comm.rank,
        "pid": os.getpid(),
        "store": os.environ["CCLCTL_STORE"],
        "job": os.environ["CCLCTL_JOB"],
    }
    print(json.dumps(ready), flush=True)
    deadline = time.monotonic() + BACKSTOP_S
    try:
        while time.monotonic() < deadline:
            comm.all_reduce(buf)
    except CommAborted as exc:
        raised_ns = time.time_ns()
        print(f"ABORTED {raised_ns} {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
        return 0
    finally:
        comm.close()
    print(f"rank {comm.rank} was never aborted", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
