"""A rank of a shrink test: ``ITERS`` exact all_reduces, shrinking away a rank that dies.

Rank ``g`` (its global rank) contributes ``(g + 1) * (i + 1)`` to iteration ``i`` (int64,
exact), so each result names the ranks it summed. ``SHRINK=auto`` relies on
``CCLCTL_ON_FAILURE=shrink`` (the call re-runs by itself); ``SHRINK=explicit`` catches the
revoked call, calls ``comm.shrink()`` and redoes the iteration. Each line on stdout
(``rank g iter i value world w t time_ns``) is an event the test can wait on; at the end the rank
writes ``OUT/rank<g>.json`` (results, final members and comm id) and exits 0 (with
``HOLD=1`` once ``OUT/release`` exists, so the test can look at the live job first).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import cclctl
from cclctl.errors import CommError

ITERS = int(os.environ.get("ITERS", "12"))
PAUSE = float(os.environ.get("PAUSE", "0"))
COUNT = int(os.environ.get("COUNT", "4096"))
MODE = os.environ.get("SHRINK", "auto")
OUT = Path(os.environ["OUT"])


def main() -> int:
    comm = cclctl.init()
    me = comm.rank  # the global rank: a shrink renumbers comm.rank
    shrinks: list[list[int]] = []
    comm.on_shrink(lambda c, excluded: shrinks.append(excluded))
    buf = np.empty(COUNT, np.int64)
    results: list[int] = []
    i = 0
    while i < ITERS:
        buf[:] = (me + 1) * (i + 1)
        try:
            comm.all_reduce(buf)
        except CommError as exc:
            if MODE != "explicit":
                raise
            print(f"rank {me} revoked: {exc}", file=sys.stderr, flush=True)
            comm = comm.shrink()
            shrinks.append([])
            continue  # the same iteration again, among the survivors
        if not (buf == buf[0]).all():
            raise SystemExit(f"rank {me}: iteration {i} is not uniform")
        results.append(int(buf[0]))
        done_ns = time.time_ns()
        print(f"rank {me} iter {i} {int(buf[0])} world {comm.world_size} t {done_ns}", flush=True)
        i += 1
        if PAUSE:
            time.sleep(PAUSE)
    info = comm.shrink_info
    spread = max(info.done.values()) - min(info.done.values()) if info else None
    doc = {"rank": me, "results": results, "members": comm.members, "comm": comm.id,
           "new_rank": comm.rank, "shrinks": shrinks, "spread": spread}  # fmt: skip
    (OUT / f"rank{me}.json").write_text(json.dumps(doc))
    if os.environ.get("HOLD") == "1":  # until the test lets go (at most a minute)
        release = OUT / "release"
        deadline = time.monotonic() + 60
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
