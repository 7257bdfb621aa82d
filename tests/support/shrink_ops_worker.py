"""A rank of a shrink test of the calls beside all_reduce: ``ITERS`` iterations of ``OP``
(broadcast or reduce, from or to the job's rank ``ROOT``; or all_gather, or all_to_allv of
blocks of 1 to n elements), each followed by
an all_reduce that gives every rank the iteration's result, with ``CCLCTL_ON_FAILURE=shrink``.

Rank ``g`` (its global rank) puts ``(g + 1) * (i + 1)`` into iteration ``i`` (int64, exact):
a broadcast gives every rank ``(ROOT + 1) * (i + 1)``, which the all_reduce sums over the
ranks; a reduce gives ``ROOT`` the sum over the ranks, which the all_reduce (every other
rank adding 0) hands to all. Each line on stdout is an event the test can wait on:
``rank g iter i value world w`` per iteration, ``rank g failed: <error>`` for an error (the
rank exits 3). At the end the rank writes ``OUT/rank<g>.json`` and exits 0.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

import cclctl
from cclctl.errors import CommError

ITERS = int(os.environ.get("ITERS", "6"))
COUNT = int(os.environ.get("COUNT", "1024"))
OP = os.environ.get("OP", "broadcast")
ROOT = int(os.environ.get("ROOT", "0"))  # the job's rank
OUT = Path(os.environ["OUT"])


def iteration(comm: Any, me: int, i: int) -> int:
    """Iteration ``i``'s two calls; the value every rank then holds."""
    buf = np.full(COUNT, (me + 1) * (i + 1), np.int64)
    root = comm.members.index(ROOT)  # the root's rank in the communicator as it is now
    if OP == "broadcast":
        comm.broadcast(buf, root)
    elif OP == "reduce":
        comm.reduce(buf, root=root)
        if me != ROOT:
            buf[:] = 0
    elif OP == "all_to_allv":
        n = comm.world_size
        sizes = [1 + (comm.rank + j) % n for j in range(n)]
        got = [1 + (i + comm.rank) % n for i in range(n)]
        comm.all_to_allv(buf[: sum(sizes)].copy(), np.empty(sum(got), np.int64), sizes, got)
    else:
        comm.all_gather(buf[:4], np.empty(4 * comm.world_size, np.int64))
    comm.all_reduce(buf)
    if not (buf == buf[0]).all():
        raise SystemExit(f"rank {me}: iteration {i} is not uniform")
    return int(buf[0])


def main() -> int:
    comm = cclctl.init()
    me = comm.rank  # the global rank: a shrink renumbers comm.rank
    shrinks: list[list[int]] = []
    comm.on_shrink(lambda c, excluded: shrinks.append(excluded))
    results: list[int] = []
    worlds: list[int] = []
    for i in range(ITERS):
        try:
            value = iteration(comm, me, i)
        except CommError as exc:
            print(f"rank {me} failed: {exc}", flush=True)
            comm.close()
            return 3
        results.append(value)
        worlds.append(comm.world_size)
        print(f"rank {me} iter {i} {value} world {comm.world_size}", flush=True)
    info = comm.shrink_info
    spread = max(info.done.values()) - min(info.done.values()) if info else None
    doc = {"rank": me, "results": results, "worlds": worlds, "members": comm.members,
           "comm": comm.id, "new_rank": comm.rank, "shrinks": shrinks,
           "spread": spread}  # fmt: skip
    (OUT / f"rank{me}.json").write_text(json.dumps(doc))
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
