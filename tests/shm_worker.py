"""A rank that reports its transport and the job's files in /dev/shm, then all-reduces.

Prints JSON lines: ``{"rank", "transport", "files"}`` once joined, then either
``{"rank", "done"}`` or ``{"rank", "error", "message", "seconds"}`` (how long the failing
call took). ``ITERS`` all-reduces of ``COUNT`` floats; ``CCLCTL_FAULT`` may kill a rank.
"""

from __future__ import annotations

import json
import os
import sys
import time
import zlib

import numpy as np

import cclctl
from cclctl.errors import CclError
from cclctl.runtime.shm_segment import SHM_DIR


def job_files(job: str) -> list[str]:
    prefix = f"cclctl-{zlib.crc32(job.encode()):08x}-"
    return sorted(p.name for p in SHM_DIR.iterdir() if p.name.startswith(prefix))


def main() -> int:
    comm = cclctl.init()
    job = comm.cfg.job
    say = {"rank": comm.rank, "transport": comm.transport.name, "files": job_files(job)}
    print(json.dumps(say), flush=True)
    x = np.ones(int(os.environ.get("COUNT", "1024")), np.float32)
    started = time.monotonic()
    try:
        for _ in range(int(os.environ.get("ITERS", "10"))):
            started = time.monotonic()
            comm.all_reduce(x)
    except CclError as exc:
        took = time.monotonic() - started
        print(
            json.dumps(
                {
                    "rank": comm.rank,
                    "error": type(exc).__name__,
                    "message": str(exc),
                    "seconds": took,
                }
            ),
            flush=True,
        )
        return 1
    comm.close()
    print(json.dumps({"rank": comm.rank, "done": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
