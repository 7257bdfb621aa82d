"""One rank of ``benchmarks/kill_latency.py``: all_reduce after all_reduce, no pause, until a
collective raises.

After ``READY_AFTER`` calls it prints ``RUNNING`` on stdout (the benchmark kills a rank once
every rank has), and keeps calling, so the job is inside a collective when the kill
lands. When a call raises, it prints one JSON line on stderr, ``RAISED {...}``: the wall
clock as it caught the error (``raised_ns``), when the failing call was entered
(``entered_ns``), how many calls it had finished, and the error with the revoke record it
carries (origin, who saw it first, how, and when it was recorded), so the benchmark can say
where the time went. It then holds until the file named by its first argument exists (at
most 60 s), so no survivor's exit breaks a link under another's measurement, closes its
communicator and exits 0. A rank that never fails gives up after 60 s (exit 1).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import cclctl
from cclctl.errors import CclError

BACKSTOP_S = 60.0
READY_AFTER = int(os.environ.get("READY_AFTER", "20"))
COUNT = int(os.environ.get("COUNT", "4096"))


def raised_line(rank: int, exc: CclError, raised_ns: int, entered_ns: int, calls: int) -> str:
    """The ``RAISED`` JSON line for the error ``exc`` this rank caught."""
    rev = getattr(exc, "revocation", None)
    record = None
    if rev is not None:
        record = {
            "kind": rev.kind,
            "origin": rev.origin,
            "seen_by": rev.seen_by,
            "via": rev.via,
            "time_ns": rev.time_ns,
        }
    line = {
        "rank": rank,
        "raised_ns": raised_ns,
        "entered_ns": entered_ns,
        "calls": calls,
        "error": f"{type(exc).__name__}: {exc}",
        "record": record,
    }
    return "RAISED " + json.dumps(line)


def main() -> int:
    release = sys.argv[1]
    comm = cclctl.init()
    buf = np.zeros(COUNT, np.float32)  # sums stay 0: nothing overflows
    deadline = time.monotonic() + BACKSTOP_S
    calls = 0
    try:
        while time.monotonic() < deadline:
            entered_ns = time.time_ns()
            comm.all_reduce(buf)
            calls += 1
            if calls == READY_AFTER:
                print("RUNNING", flush=True)
    except CclError as exc:
        raised_ns = time.time_ns()
        print(
            raised_line(comm.rank, exc, raised_ns, entered_ns, calls), file=sys.stderr, flush=True
        )
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
        return 0
    finally:
        comm.close()
    print(f"rank {comm.rank} never saw a failure", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
