"""PyTorch Flight Recorder dumps at scale: cclctl's reader and diagnosis vs PyTorch's own
analyzer (``python -m torch.distributed.flight_recorder.fr_trace``) on the same files.

Writes ``--ranks`` dumps of ``--entries`` entries each, as NCCL writes them (pickle, group
config, ``state`` updated, a stack of ``--frames`` frames per entry; ``--protocol 2`` is
what torch's own pickler writes, unframed, and the default), for a job of two
process groups hung at the last all_reduce of the world group, which one rank never
entered. Each reader runs in a child process of its own; its wall time and peak RSS (from
``wait4``) are reported, and for cclctl also how many reader processes it forks (one per
usable CPU, up to 8, see cclctl.diagnose_io.fr_pool) and the largest of them.
cclctl's verdict is also computed for a few shuffled file orders and must not change.
Asserts nothing else.

    python benchmarks/torch_fr_scale.py [--ranks 512] [--entries 2000] [--frames 12]
        [--protocol 2] [--no-pytorch]
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Entries start a minute before the dumps are written, as after a real hang.
T0 = time.time_ns() - 60_000_000_000

READ_CCLCTL = """
import json, resource, sys
from cclctl.diagnose.engine import diagnose
from cclctl.diagnose.model import Options
from cclctl.diagnose_io.flight_recorder import load_flight_recorder
from cclctl.diagnose_io.fr_pool import MAX_WORKERS, cores
snaps = load_flight_recorder(sys.argv[1:])
diag = diagnose(snaps, options=Options(stuck_after_s=5))
v = diag.verdicts[0]
worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
readers = min(cores(), MAX_WORKERS)
verdict = json.dumps([v.kind, v.ranks, v.comm, v.seq, v.op])
print(verdict, f"(largest of {readers} readers {worker:.0f} MB)")
"""


def _frames(depth: int) -> list[dict[str, Any]]:
    files = [f"/opt/venv/lib/python3.11/site-packages/pkg{i}/module{i}.py" for i in range(depth)]
    return [{"name": f"function_{i}", "filename": files[i], "line": 100 + i} for i in range(depth)]


def _entries(n: int, tp_name: str, frames: list[dict[str, Any]], last_done: bool) -> list[Any]:
    """One rank's ring: every 4th call on its tp group (its pair of ranks, named as
    torch names groups: by creation), the rest on the world; the last world all_reduce is
    still running (or absent, for the straggler)."""
    out = []
    world_seq = tp_seq = 0
    for i in range(n):
        tp = i % 4 == 2
        if tp:
            tp_seq += 1
        else:
            world_seq += 1
        running = i == n - 1
        out.append({
            "record_id": i, "pg_id": 1 if tp else 0,
            "process_group": (tp_name, "tp") if tp else ("0", "default_pg"),
            "collective_seq_id": tp_seq if tp else world_seq, "p2p_seq_id": 0, "op_id": i + 1,
            "profiling_name": "nccl:all_gather" if tp else "nccl:all_reduce",
            "time_created_ns": T0 + i * 1_000_000, "timeout_ms": 600_000,
            "input_sizes": [[1 << 20]], "input_dtypes": ["BFloat16"],
            "output_sizes": [[2, 1 << 20]] if tp else [[1 << 20]], "output_dtypes": ["BFloat16"],
            "state": "started" if running else "completed", "retired": not running,
            "time_discovered_started_ns": T0 + i * 1_000_000 + 1000,
            "time_discovered_completed_ns": None if running else T0 + i * 1_000_000 + 400_000,
            "duration_ms": None if running else 0.4, "is_p2p": False,
            "frames": [dict(f) for f in frames],  # new dicts, shared strings: as torch writes
            "thread_id": "140000000000000", "thread_name": "pt_main_thread",
        })  # fmt: skip
    if not last_done:
        out.pop()  # the straggler never entered the last call
    return out


def write_dumps(folder: Path, ranks: int, entries: int, depth: int, protocol: int = 2) -> None:
    frames = _frames(depth)
    straggler = ranks // 3
    for rank in range(ranks):
        pair = rank // 2
        name = str(1 + pair)  # every rank creates every pair's group, in the same order
        config = {
            "0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(ranks)))},
            name: {"name": name, "desc": "tp", "ranks": str([2 * pair, 2 * pair + 1])},
        }
        ring = _entries(entries, name, frames, rank != straggler)
        doc = {"version": "2.10", "comm_lib_version": "2.21.5", "pg_config": config,
               "pg_status": {}, "entries": ring}  # fmt: skip
        (folder / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(doc, protocol=protocol))


def measure(cmd: list[str]) -> tuple[float, float, float, str, int]:
    """(wall seconds, CPU seconds with its own children, peak RSS in MB, output tail, exit
    code) of one child process. CPU time is the steadier number on a busy machine.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )  # fmt: skip
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    cpu = usage.ru_utime + usage.ru_stime
    return seconds, cpu, usage.ru_maxrss / 1024, out.strip()[-300:], proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--frames", type=int, default=12)
    parser.add_argument(
        "--protocol", type=int, default=2, help="pickle protocol of the dumps (torch writes 2)"
    )
    parser.add_argument("--orders", type=int, default=3, help="shuffled file orders to check")
    parser.add_argument("--no-pytorch", action="store_true", help="skip PyTorch's analyzer")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        write_dumps(folder, args.ranks, args.entries, args.frames, args.protocol)
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(f"{args.ranks} dumps x {args.entries} entries ({args.frames} frames each, "
              f"pickle protocol {args.protocol}): "
              f"{size / 1e6:.0f} MB written in {time.perf_counter() - t0:.1f}s")  # fmt: skip
        files = sorted(str(p) for p in folder.iterdir())
        secs, cpu, rss, out, code = measure([sys.executable, "-c", READ_CCLCTL, str(folder)])
        print(f"cclctl   : {secs:6.1f}s wall {cpu:6.1f}s CPU {rss:6.0f} MB  exit {code}  {out}")
        verdicts = {out.split(" (")[0]}  # the verdict, without the memory note
        for seed in range(args.orders):
            order = files[:]
            random.Random(seed).shuffle(order)
            verdicts.add(measure([sys.executable, "-c", READ_CCLCTL, *order])[3].split(" (")[0])
        print(f"cclctl verdicts over {args.orders + 1} file orders: {len(verdicts)} distinct")
        if args.no_pytorch:
            return
        torch_cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                     str(folder), "-p", "nccl_trace_rank_"]  # fmt: skip
        secs, cpu, rss, out, code = measure(torch_cmd)
        last = out.splitlines()[-1] if out else ""
        tail = last[:70]
        print(f"fr_trace : {secs:6.1f}s wall {cpu:6.1f}s CPU {rss:6.0f} MB  exit {code}  {tail}")


if __name__ == "__main__":
    main()
