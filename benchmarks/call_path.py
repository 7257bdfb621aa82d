"""What the call path costs a collective: a one-rank job's 8-byte all_reduce, main thread's
CPU per call (asserts nothing).

One rank moves no bytes, so what is left is everything a call does around its algorithm:
checks, the recovery policy, open (seq, record, fault plan), dispatch, close, telemetry's
``start``. CPU time of the calling thread (``time.thread_time_ns``), not wall time, so other
work on a shared machine moves it little; the median over blocks is printed. To compare two
revisions, run it in each checkout, in turns::

    PYTHONPATH=. python benchmarks/call_path.py [--blocks 9] [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
from fault_matrix_cases import free_port


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--calls", type=int, default=2000, help="calls per block")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as dumps:
        os.environ.update(
            RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
            CCLCTL_TRACE_DIR=dumps,
        )  # fmt: skip
        import cclctl

        comm = cclctl.init()
        buf = np.ones(2, dtype=np.float32)

        def block() -> float:
            start = time.thread_time_ns()
            for _ in range(args.calls):
                comm.all_reduce(buf)
            return (time.thread_time_ns() - start) / args.calls / 1000

        for _ in range(3):
            block()  # warm: caches, the fold thread's first batches
        per_call = [block() for _ in range(args.blocks)]
        comm.close()
    spread = f"blocks {min(per_call):.2f}-{max(per_call):.2f}, {args.blocks} x {args.calls}"
    print(f"main thread's CPU per call: median {statistics.median(per_call):.2f} us ({spread})")


if __name__ == "__main__":
    main()
