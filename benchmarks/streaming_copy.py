"""numpy copy bandwidth with glibc's default and with cclctl's streaming threshold (asserts
nothing; it measures).

``cclctl launch`` starts ranks with ``GLIBC_TUNABLES`` naming a non-temporal threshold
(``cclctl/launch/streaming_copies.py``). This shows what that buys on this machine: one
process copying alone, and several copying at once (as ranks do), each in a fresh process
started with and without the tunable, at every size given.

    python benchmarks/streaming_copy.py [--sizes 4M,16M,64M,256M] [--procs 1,2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from cclctl.benchmark.sizes import parse_size
from cclctl.launch import streaming_copies

_CHILD = """
import os, sys, time
import numpy as np
size, procs, reps = (int(x) for x in sys.argv[1:4])
src, dst = np.ones(size, np.uint8), np.zeros(size, np.uint8)
np.copyto(dst, src)
read, write = os.pipe()
children = []
for _ in range(procs - 1):
    pid = os.fork()
    if pid == 0:
        os.read(read, 1)
        for _ in range(reps):
            np.copyto(dst, src)
        os._exit(0)
    children.append(pid)
os.write(write, b"x" * (procs - 1))
times = []
for _ in range(reps):
    t0 = time.perf_counter()
    np.copyto(dst, src)
    times.append(time.perf_counter() - t0)
for pid in children:
    os.waitpid(pid, 0)
times.sort()
print(size / times[len(times) // 2] / 1e9)
"""


def copy_gbs(size: int, procs: int, env: dict[str, str]) -> float:
    """GB/s of one copy of ``size`` bytes while ``procs`` processes copy at once (the
    median copy of one of them)."""
    reps = max(5, min(200, (1 << 30) // size))
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(size), str(procs), str(reps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return float(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4M,16M,64M,256M")
    parser.add_argument("--procs", default="1,2", help="processes copying at once")
    args = parser.parse_args()
    default = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    streaming = streaming_copies.rank_environment(default)
    print(f"streaming: {streaming.get('GLIBC_TUNABLES', '(off)')}")
    print(f"{'size':>10} {'procs':>6} {'glibc default':>14} {'streaming':>10} {'ratio':>6}  GB/s")
    for procs in (int(p) for p in args.procs.split(",")):
        for size in (parse_size(s, "--sizes") for s in args.sizes.split(",")):
            plain, fast = copy_gbs(size, procs, default), copy_gbs(size, procs, streaming)
            print(f"{size:>10} {procs:>6} {plain:>14.2f} {fast:>10.2f} {fast / plain:>6.2f}")
            time.sleep(0.1)


if __name__ == "__main__":
    main()
