"""The relay's efficiency under forced staging: each collective staged through host memory
(``CCLCTL_STAGE=always``) against the same call on host buffers, 1-64 MiB (asserts
nothing; it measures).

One job (``cclctl launch``, 2 ranks by default, the transport cclctl picks on one host)
runs, per size and op, rounds of a host call and a relayed call, each after a barrier, a
call's time being the slowest rank's. Per relayed call it reads the record's ``stages``
(d2h, collective, h2d) and computes ``relay_efficiency = busbw / min(stage bandwidths)``,
the slowest stage's time over the call's (1.0: every other stage hidden behind it). The
medians over rounds are printed: host and relay busbw, their ratio, the efficiency and
each stage's milliseconds.

Where torch sees an accelerator (``torch.accelerator.is_available()``: CUDA or any other)
the relayed buffers are device tensors, staged by the torch relay
(``cclctl/integrations/torch/relay_copier.py``: pinned staging, a copy stream, timing
events); otherwise they are numpy arrays staged by ``ThreadCopier`` (a copy thread as the
copy engine, so the copies overlap the host collective as a device's would). The machine
this was written on has no accelerator: only the CPU numbers were measured there.

With ``--two-hosts`` (root) the ranks run on two network-namespace hosts joined by a veth
pair, half on each (``two_hosts.py``'s), so the wire stage is TCP between hosts: the path
the relay is for (chips of two hosts exchanging through host memory).

    python benchmarks/relay.py [--ranks 2] [--min 1M --max 64M] [--rounds 5]
        [--ops all_reduce,all_gather,reduce_scatter,broadcast] [--chunk 4M] [--depth 4]
        [--copier thread|host] [--two-hosts] [--rev REV] [--json relay.json]

``--rev`` runs the ranks on cclctl as committed at a revision (a change's parent), for a
before-and-after in turns.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from peers import parse_size, sizes_between
from peers_paired import export_tree, importing_first

from cclctl.bandwidth import bus_factor


def _call(target: Any, op: str, buf: Any, out: Any) -> None:
    """``op`` by a communicator or a relay (their signatures agree)."""
    if op == "all_reduce":
        target.all_reduce(buf)
    elif op == "broadcast":
        target.broadcast(buf, 0)
    elif op == "all_gather":
        target.all_gather(buf, out)
    else:
        target.reduce_scatter(buf, out)


def _buffers(op: str, count: int, n: int, make: Any) -> tuple[Any, Any]:
    """(buf, out) of ``count`` elements per rank, by ``make(count)``."""
    if op == "all_gather":
        return make(count), make(count * n)
    if op == "reduce_scatter":
        return make(count * n), make(count)
    return make(count), None


def _relay(comm: Any, cfg: Any, copier: str) -> tuple[Any, Any, str]:
    """The relay, a maker of its buffers, and the device it stages from (``copier``: how
    CPU buffers are copied, ``thread`` or ``host``)."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.accelerator.is_available():
        from cclctl.integrations.torch.relay_copier import TensorRelay

        device = torch.accelerator.current_accelerator()
        relay = TensorRelay(comm, cfg).relay(device)
        return relay, lambda c: torch.ones(c, dtype=torch.float32, device=device), str(device)
    from cclctl.runtime.relay.copier import HostCopier, ThreadCopier
    from cclctl.runtime.relay.relay import Relay

    copies = ThreadCopier() if copier == "thread" else HostCopier()
    return Relay(comm, copies, cfg), lambda c: np.ones(c, np.float32), f"cpu ({copier} copies)"


def _worker(args: argparse.Namespace) -> int:
    """One rank: every size and op in rounds; rank 0 prints one JSON line per (op, size)."""
    import cclctl
    from cclctl.runtime.relay.efficiency import relay_efficiency

    comm = cclctl.init()
    n = comm.world_size
    cfg = comm.cfg.replace(
        stage="always", stage_chunk=parse_size(args.chunk), stage_depth=args.depth
    )
    relay, make, device = _relay(comm, cfg, args.copier)

    def timed(target: Any, op: str, buf: Any, out: Any) -> float:
        comm.barrier()
        t0 = time.perf_counter()
        _call(target, op, buf, out)
        mine = np.array([time.perf_counter() - t0])
        return float(comm.all_reduce(mine, "max")[0])

    for size in (int(s) for s in args.sizes.split(",")):
        count = max(size // 4 // n * n, n)
        for op in args.ops.split(","):
            host = _buffers(op, count, n, lambda c: np.ones(c, np.float32))
            dev = _buffers(op, count, n, make)
            rows: dict[str, list[float]] = {"host": [], "relay": [], "efficiency": []}
            stages: dict[str, list[float]] = {}
            _call(relay, op, *dev)  # warm: the staging ring made, links and plans set up
            for _ in range(args.rounds):
                rows["host"].append(timed(comm, op, *host))
                rows["relay"].append(timed(relay, op, *dev))
                rec = relay.last
                nbytes = count * 4 * (n if op in ("all_gather", "reduce_scatter") else 1)
                rows["efficiency"].append(
                    relay_efficiency(op, nbytes, n, rec.duration_ns, rec.stages)
                )
                for name, ns in rec.stages.items():
                    stages.setdefault(name, []).append(ns / 1e6)
            if comm.rank == 0:
                bus = nbytes * bus_factor(op, n) / 1e9
                med = {k: statistics.median(v) for k, v in rows.items()}
                print(json.dumps({
                    "op": op, "bytes": nbytes, "ranks": n, "device": device,
                    "host_busbw": bus / med["host"], "relay_busbw": bus / med["relay"],
                    "efficiency": med["efficiency"],
                    "stages_ms": {k: statistics.median(v) for k, v in stages.items()},
                }), flush=True)  # fmt: skip
    comm.close()
    return 0


def render(rows: list[dict[str, Any]]) -> str:
    head = f"{'op':<15}{'size':>8}  {'host GB/s':>9}  {'relay GB/s':>10}  {'ratio':>5}  "
    head += f"{'eff':>5}  {'d2h ms':>7}  {'coll ms':>7}  {'h2d ms':>7}"
    lines = [head]
    for r in rows:
        ms = r["stages_ms"]
        lines.append(
            f"{r['op']:<15}{r['bytes'] >> 20:>6}Mi  {r['host_busbw']:>9.2f}  "
            f"{r['relay_busbw']:>10.2f}  {r['relay_busbw'] / r['host_busbw']:>5.2f}  "
            f"{r['efficiency']:>5.2f}  {ms.get('d2h', 0):>7.2f}  {ms.get('collective', 0):>7.2f}  "
            f"{ms.get('h2d', 0):>7.2f}"
        )
    return "\n".join(lines)


def _one_host(cmd: list[str], ranks: int, env: dict[str, str]) -> list[dict[str, Any]]:
    """The ranks as one `cclctl launch` job on this host; rank 0's rows."""
    from cclctl.launch.launcher import launch

    lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
    result = launch(
        cmd,
        ranks,
        env=env,
        output=lambda rank, stream, line: lines[stream].append(f"[{rank}] {line}"),
        timeout_s=3600,
    )
    if result.returncode:
        print("\n".join(lines["stderr"][-20:]), file=sys.stderr)
        raise SystemExit(f"the ranks failed with exit code {result.returncode}")
    return [json.loads(ln.split("] ", 1)[1]) for ln in lines["stdout"] if '] {"op"' in ln]


def _two_hosts(cmd: list[str], ranks: int, port: int, env: dict[str, str]) -> list[dict[str, Any]]:
    """The ranks on two network-namespace hosts (``two_hosts.py``'s), half on each; rank
    0's rows. Needs root."""
    sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "support"))
    from two_hosts import rank0_lines

    lines = rank0_lines(cmd, ranks, port, env, "the relay benchmark")
    return [json.loads(ln) for ln in lines if ln.startswith('{"op"')]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--min", default="1M")
    ap.add_argument("--max", default="64M")
    ap.add_argument("--factor", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", default="all_reduce")
    ap.add_argument("--chunk", default="4M", help="CCLCTL_STAGE_CHUNK")
    ap.add_argument("--depth", type=int, default=4, help="CCLCTL_STAGE_DEPTH")
    ap.add_argument(
        "--copier", default="thread", choices=("thread", "host"),
        help="CPU buffers: copies on a copy thread (overlapping) or inline",
    )  # fmt: skip
    ap.add_argument(
        "--two-hosts", action="store_true",
        help="the ranks on two network-namespace hosts, half on each (root): the wire "
        "stage over TCP between them",
    )  # fmt: skip
    ap.add_argument("--port", type=int, default=29900, help="--two-hosts: rank 0's store port")
    ap.add_argument("--rev", default="", help="run cclctl as committed at this git revision")
    ap.add_argument("--json", default="", help="also write the rows here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return _worker(args)
    sizes = sizes_between(parse_size(args.min), parse_size(args.max), args.factor)
    cmd = [sys.executable, __file__, "--worker", "--ops", args.ops, "--rounds", str(args.rounds)]
    cmd += ["--chunk", args.chunk, "--depth", str(args.depth), "--sizes", ",".join(map(str, sizes))]
    cmd += ["--copier", args.copier]
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    with tempfile.TemporaryDirectory(prefix="cclctl-rev-") as tree:
        env = {"PYTHONPATH": importing_first(export_tree(args.rev, tree))} if args.rev else {}
        if args.two_hosts:
            rows = _two_hosts(cmd, args.ranks, args.port, env)
        else:
            rows = _one_host(cmd, args.ranks, env)
    device = rows[0]["device"] if rows else "?"
    where = "on two hosts (TCP between them)" if args.two_hosts else "on one host"
    rev = f", cclctl at {args.rev}" if args.rev else ""
    print(f"# {args.ranks} ranks {where}{rev}, relayed from {device}, chunk {args.chunk} x "
          f"{args.depth}; load average {load} before, "
          f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])} after")  # fmt: skip
    print(render(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
