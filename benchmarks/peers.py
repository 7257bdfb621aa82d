"""cclctl against its peers on this machine, in one run (asserts nothing; it measures).

For 2 and 4 ranks and sizes from 1 KiB to 256 MiB it times all_reduce, all_gather,
reduce_scatter and broadcast on cclctl over shared memory (on plain numpy buffers, and
zero-copy on shared buffers from ``comm.empty()``: ``cclctl-zc``) and over TCP, on gloo through
torch.distributed and on Open MPI through mpi4py, and the machine's limit: numpy copy and
add bandwidth of one process at the same sizes (the better of glibc's default copy and of
the streaming copy cclctl's launcher sets up for its ranks). It prints busbw (nccl-tests'
definition), cclctl's ratio to each peer and to the limit, the per-call latency of an 8-byte
all_reduce, and whether each goal of the performance issue is met; it writes everything as JSON.
Peers that are not installed are reported as skipped.

    pip install torch==2.13.0 mpi4py    # (apt-get install openmpi-bin libopenmpi-dev first)
    python benchmarks/peers.py [--ranks 2,4] [--max 256M] [--ops all_reduce] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from peers_report import best_rows, goals, render
from streaming_copy import copy_gbs

from cclctl.launch import streaming_copies
from cclctl.launch.launcher import launch

WORKER = str(Path(__file__).with_name("peers_worker.py"))
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = UNITS.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


def sizes_between(lo: int, hi: int, factor: int) -> list[int]:
    out, size = [], lo
    while size <= hi:
        out.append(size)
        size *= factor
    return out


def machine_limit(sizes: list[int], reps: int) -> dict[str, dict[int, float]]:
    """numpy copy and add bandwidth (GB/s of the destination) of one process, per size."""
    limit: dict[str, dict[int, float]] = {"copy": {}, "add": {}}
    for size in sizes:
        a = np.ones(size // 4, np.float32)
        b, c = np.ones_like(a), np.empty_like(a)
        calls = max(2, min(2000, (256 << 20) // size))
        kernels: dict[str, Callable[[], object]] = {
            "copy": functools.partial(np.copyto, c, a),
            "add": functools.partial(np.add, a, b, out=c),
        }
        for name, fn in kernels.items():
            fn()
            best = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                best = min(best, (time.perf_counter() - t0) / calls)
            limit[name][size] = size / best / 1e9
    return limit


def streaming_machine_limit(sizes: list[int], reps: int) -> dict[str, dict[int, float]]:
    """:func:`machine_limit` in a process started as ``cclctl launch`` starts ranks, with
    the streaming-copy threshold (``launch/streaming_copies.py``). The limit is the better
    of the two: cclctl's copies must not be judged against a copy slower than theirs."""
    proc = subprocess.run(
        [sys.executable, __file__, "--limit-only", ",".join(map(str, sizes)), "--reps", str(reps)],
        env=streaming_copies.rank_environment(os.environ),
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    )
    raw: dict[str, dict[str, float]] = json.loads(proc.stdout)
    return {kind: {int(size): v for size, v in by_size.items()} for kind, by_size in raw.items()}


def copies_together(rank_counts: list[int], sizes: list[int]) -> dict[str, dict[str, float]]:
    """GB/s each process gets when as many processes as ranks copy at once (streaming
    copies, as launched ranks run): what memory gives every rank of a large collective,
    against the one-process copy the goals are judged by."""
    env = streaming_copies.rank_environment(os.environ)
    return {
        str(n): {str(size): copy_gbs(size, n, env) for size in sizes} for n in rank_counts if n > 1
    }


_SPIN = (
    "import time; t = time.perf_counter(); sum(range(3_000_000)); print(time.perf_counter() - t)"
)


def effective_cores(n: int = 2) -> float:
    """How many cores ``n`` busy processes really get now (n on an idle n-core machine):
    a shared machine's other jobs and hypervisor steal show up here.
    """

    def spin(count: int) -> float:
        procs = [
            subprocess.Popen([sys.executable, "-c", _SPIN], stdout=subprocess.PIPE, text=True)
            for _ in range(count)
        ]
        return max(float(p.communicate()[0]) for p in procs)

    alone = min(spin(1) for _ in range(2))
    together = min(spin(n) for _ in range(2))
    return round(n * alone / together, 2)


def _parse(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines if line.startswith('{"runtime"')]


def run_cclctl(
    n: int, transport: str, worker_args: list[str], runtime: str = "cclctl"
) -> list[dict[str, Any]]:
    lines: list[str] = []
    result = launch(
        [sys.executable, WORKER, "--runtime", runtime, *worker_args],
        n,
        env={"CCLCTL_TRANSPORT": transport},
        output=lambda rank, stream, line: lines.append(line) if stream == "stdout" else None,
        timeout_s=1800,
    )
    if result.returncode:
        raise RuntimeError(f"cclctl ({transport}) ranks failed with exit code {result.returncode}")
    return _parse(lines)


def run_gloo(n: int, worker_args: list[str]) -> list[dict[str, Any]]:
    lines: list[str] = []
    result = launch(
        [sys.executable, "-W", "ignore::FutureWarning", WORKER, "--runtime", "gloo", *worker_args],
        n,
        output=lambda rank, stream, line: lines.append(line) if stream == "stdout" else None,
        timeout_s=1800,
    )
    if result.returncode:
        raise RuntimeError(f"gloo ranks failed with exit code {result.returncode}")
    return _parse(lines)


def run_mpi(n: int, worker_args: list[str]) -> list[dict[str, Any]]:
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(n)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    proc = subprocess.run(
        [*cmd, sys.executable, WORKER, "--runtime", "mpi", *worker_args],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if proc.returncode:
        raise RuntimeError(f"mpirun failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
    return _parse(proc.stdout.splitlines())


def run_one(name: str, n: int, worker_args: list[str]) -> list[dict[str, Any]]:
    if name == "gloo":
        return run_gloo(n, worker_args)
    if name == "openmpi":
        return run_mpi(n, worker_args)
    if name == "cclctl-zc":
        return run_cclctl(n, "auto", worker_args, runtime="cclctl-zc")
    return run_cclctl(n, name.removeprefix("cclctl-").replace("shm", "auto"), worker_args)


def peers_available() -> dict[str, str]:
    """Runtime name -> '' when it can run, else why it is skipped."""
    torch = importlib.util.find_spec("torch") is not None
    mpi = importlib.util.find_spec("mpi4py") is not None and shutil.which("mpirun")
    return {
        "cclctl-zc": "",
        "cclctl-shm": "",
        "cclctl-tcp": "",
        "gloo": "" if torch else "torch is not installed (pip install torch==2.13.0)",
        "openmpi": ""
        if mpi
        else "mpi4py or mpirun is missing (apt-get install openmpi-bin "
        "libopenmpi-dev; pip install mpi4py)",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--min", default="1K")
    ap.add_argument("--max", default="256M")
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--passes",
        type=int,
        default=1,
        help="run every runtime this many times, alternating, and keep the best of each",
    )
    ap.add_argument("--runtimes", default="cclctl-zc,cclctl-shm,cclctl-tcp,gloo,openmpi")
    ap.add_argument("--json", default="peers-results.json")
    ap.add_argument("--limit-only", metavar="SIZES", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.limit_only:  # the child of streaming_machine_limit
        print(json.dumps(machine_limit([int(s) for s in args.limit_only.split(",")], args.reps)))
        return 0
    sizes = sizes_between(parse_size(args.min), parse_size(args.max), args.factor)
    worker_args = [
        "--ops",
        args.ops,
        "--sizes",
        ",".join(map(str, sizes)),
        "--reps",
        str(args.reps),
    ]
    available = peers_available()
    wanted = args.runtimes.split(",")
    skipped = {name: why for name, why in available.items() if why and name in wanted}
    rows: list[dict[str, Any]] = []
    rank_counts = [int(r) for r in args.ranks.split(",")]
    limits: list[dict[str, dict[int, float]]] = []
    cores = [effective_cores()]
    for pass_no in range(args.passes):  # alternate, so load that comes and goes hits all
        for n in rank_counts:
            for name in available:
                if name not in wanted or name in skipped:
                    continue
                print(f"# pass {pass_no + 1}: {name}, {n} ranks ...", file=sys.stderr, flush=True)
                try:
                    rows += run_one(name, n, worker_args)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    skipped[f"{name}/{n}"] = f"failed: {exc}"
        print("# machine limit (numpy, one process) ...", file=sys.stderr, flush=True)
        limits.append(machine_limit(sizes, args.reps))
        limits.append(streaming_machine_limit(sizes, args.reps))
    limit = {k: {s: max(lim[k][s] for lim in limits) for s in sizes} for k in ("copy", "add")}
    print("# copies running at once, one per rank ...", file=sys.stderr, flush=True)
    together = copies_together(rank_counts, [s for s in sizes if s >= 64 << 20])
    cores.append(effective_cores())
    doc = {
        "schema": "cclctl.peers/1",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "effective_cores_before_after": cores,  # 2 busy processes: 2.0 on an idle machine
        },
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "passes": args.passes,
        "rows": best_rows(rows),
        "limit": {k: {str(s): v for s, v in d.items()} for k, d in limit.items()},
        "copy_together": together,
        "skipped": skipped,
    }
    doc["goals"] = goals(doc)
    print(render(doc))
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"# wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
