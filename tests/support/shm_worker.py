"""A rank that reports its transport and the job's files in /dev/shm, then all-reduces.

Prints JSON lines: ``{"rank", "transport", "files"}`` once joined, then either
``{"rank", "done"}`` or ``{"rank", "error", "message"}`` (the failing call's error).
``ITERS`` all-reduces of ``COUNT`` floats, each checked; ``CCLCTL_FAULT`` may
kill a rank.
``FAKE_HOSTS=k`` puts rank r on host ``fake<r % k>`` (one machine laid out as k hosts).
"""

from __future__ import annotations

import json
import os
import sys
import zlib

import numpy as np

import cclctl
from cclctl.errors import CclError
from cclctl.runtime.transport.shm.segment import SHM_DIR


def job_files(job: str) -> list[str]:
    prefix = f"cclctl-{zlib.crc32(job.encode()):08x}-"
    return sorted(p.name for p in SHM_DIR.iterdir() if p.name.startswith(prefix))


def main() -> int:
    hosts = int(os.environ.get("FAKE_HOSTS", "0"))
    flags = {"hostname": f"fake{int(os.environ['RANK']) % hosts}"} if hosts else {}
    comm = cclctl.init(**flags)
    job = comm.cfg.job
    say = {"rank": comm.rank, "transport": comm.transport.name, "files": job_files(job)}
    print(json.dumps(say), flush=True)
    x = np.ones(int(os.environ.get("COUNT", "1024")), np.float32)
    try:
        for _ in range(int(os.environ.get("ITERS", "10"))):
            x[:] = comm.rank + 1
            comm.all_reduce(x)
            want = comm.world_size * (comm.world_size + 1) // 2
            if not (x == want).all():
                raise SystemExit(f"rank {comm.rank}: wrong all_reduce result")
    except CclError as exc:
        failed = {"rank": comm.rank, "error": type(exc).__name__, "message": str(exc)}
        print(json.dumps(failed), flush=True)
        return 1
    comm.close()
    print(json.dumps({"rank": comm.rank, "done": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
