"""What retry costs a healthy call: cclctl's collectives with retry on against retry off,
block by block in the same ranks, on one host over TCP or on two hosts.

One job (``cclctl launch``, ``CCLCTL_TRANSPORT=tcp``, retry on: the default budget) runs
every collective at every size in rounds; each round times three blocks of calls in an
order that rotates every round: ``on`` (the public calls: the retry wrapper with its copies
and confirms, and the links keeping their tails for a resume), ``off`` (one attempt of
each, as with ``CCLCTL_RETRY_BUDGET=0``, and the links keeping no tails) and ``off2`` (the
same again: the A/A control, whose distance from ``off`` is the run's noise floor). A
block's time is the slowest rank's. Each round gives a ratio of times (``off``'s over
``on``'s: 1.0 means retry costs nothing, 0.8 that a call takes 1.25x as long); the median
over rounds is printed with a 95% bootstrap interval, and beside it the ratio of the two
sides' fastest blocks (``best``: what a load spike that slowed a block leaves out).
Buffers are plain numpy float32, as ``peers_worker.py``'s: an in-place all_reduce and
broadcast (from rank 0), an all_gather and a reduce_scatter out of place.

With ``--two-hosts`` (root) the ranks run on two network-namespace hosts joined by a veth
pair, half on each (``two_hosts.py``'s), with the transport cclctl picks there: TCP with
one rank per host, the hybrid (shared memory within a host, TCP between) with more. The
parts of the cost are printed beside the table: what a confirm adds to a call (a
one-element all_reduce with one and without) and a copy of each size (what keeping an
input or a result costs).

    python benchmarks/retry_cost.py [--ranks 2] [--min 1M --max 256M] [--rounds 21]
        [--ops all_reduce,all_gather,broadcast,reduce_scatter] [--json retry-cost.json]
        [--rev REV]   (the ranks run cclctl as committed at REV: a change's parent)
        [--off-tails] [--off-confirm] [--confirm-from SIZE]   (what each part costs, apart)
        [--two-hosts [--port 29950]]   (root: half the ranks on each of two hosts)

What retry off changes beside the call is not toggled here: the links' keepalive probes
(set up with the links) are on in every block. It asserts nothing; the load on the machine
is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from paired import bootstrap_median
from peers import OPS, effective_cores, parse_size, sizes_between
from peers_paired import export_tree, importing_first

SIDES = ("on", "off", "off2")
#: (numerator, denominator) of every ratio printed: time of the first over the second's.
PAIRS = (("off", "on"), ("off", "off2"))
#: About this many bytes of buffer per block (at least one call).
BLOCK_BYTES = 16 << 20


def _worker(args: argparse.Namespace) -> int:
    """One rank: every op and size in rounds of blocks; rank 0 prints one JSON line each."""
    import cclctl
    from cclctl.runtime.comm.recovery.call import Call

    comm = cclctl.init()
    n, rank = comm.world_size, comm.rank
    links = _links(comm.transport)
    resume_s = getattr(links, "resume_s", 0.0)
    if args.confirm_from:
        from cclctl.runtime.comm import rerun

        rerun.CONFIRM_FROM = parse_size(args.confirm_from)

    def side(
        name: str, on: Callable[[], object], off: Callable[[], object]
    ) -> Callable[[], object]:
        if links is not None:
            links.resume_s = resume_s if name == "on" or args.off_tails else 0.0
        return on if name == "on" else off

    def slowest(seconds: float) -> float:
        return float(comm.attempt(Call.all_reduce(np.array([seconds]), "max"))[0])

    parts = {"transport": comm.transport.name, "confirm_us": _confirm_us(comm), "copy_ms": {}}
    for size in (int(s) for s in args.sizes.split(",")):
        count = max(size // 4 // n * n, n)
        parts["copy_ms"][str(count * 4)] = _copy_ms(count)
        x = np.zeros(count, np.float32)
        big = np.zeros(count, np.float32)
        part = np.zeros(count // n, np.float32)
        for arr in (x, big, part):
            arr.fill(0)  # every page written (peers_worker.zeros says why)
        calls = _calls(comm, x, big, part, args.off_confirm)
        per_block = max(1, BLOCK_BYTES // size)
        for op in args.ops.split(","):
            on, off = calls[op]
            for name in SIDES[:2]:  # warm both: buffers lent, pages touched, links grown
                fn = side(name, on, off)
                for _ in range(2):
                    fn()
            rounds: list[dict[str, float]] = []
            for round_no in range(args.rounds):
                shift = round_no % len(SIDES)
                got = {}
                for name in SIDES[shift:] + SIDES[:shift]:
                    fn = side(name, on, off)
                    slowest(0.0)  # a barrier
                    t0 = time.perf_counter()
                    for _ in range(per_block):
                        fn()
                    got[name] = slowest((time.perf_counter() - t0) / per_block)
                rounds.append(got)
            if rank == 0:
                print(json.dumps({"op": op, "size": count * 4, "rounds": rounds}), flush=True)
    if links is not None:
        links.resume_s = resume_s
    if rank == 0:
        print(json.dumps({"parts": parts}), flush=True)
    comm.close()
    return 0


def _links(transport: Any) -> Any:
    """The TCP links whose tails a resume keeps: the transport's, or its TCP part's (the
    hybrid's); None over shared memory alone."""
    part = getattr(transport, "tcp", None)
    return getattr(transport, "_links", None) or getattr(part, "_links", None)


def _confirm_us(comm: Any) -> float:
    """What a confirm adds to a call, in microseconds: the slowest rank's median one-element
    all_reduce that ends with one, less its median without."""
    from cclctl.runtime.comm.recovery.call import Call
    from cclctl.runtime.comm.rerun import Ending

    token = np.zeros(1, np.uint8)

    def median_us(ending: Any) -> float:
        times = []
        for _ in range(220):
            t0 = time.perf_counter()
            comm.attempt(Call.all_reduce(token, "max"), ending)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[20:]) * 1e6

    added = np.array([median_us(Ending(True)) - median_us(None)])
    return float(comm.attempt(Call.all_reduce(added, "max"))[0])


def _copy_ms(count: int) -> float:
    """The median time of one copy of ``count`` float32 into a buffer used before."""
    src, dst = np.ones(count, np.float32), np.zeros(count, np.float32)
    times = []
    for _ in range(9):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


Pair = tuple[Callable[[], object], Callable[[], object]]


def _calls(
    comm: Any, x: np.ndarray, big: np.ndarray, part: np.ndarray, confirm: bool
) -> dict[str, Pair]:
    """Each op's (public call, one attempt) on these buffers; ``confirm``: each attempt
    ends with a confirm, as the public call's does from its size on."""
    from cclctl.runtime.comm.recovery.call import Call
    from cclctl.runtime.comm.rerun import Ending

    def once(call: Any) -> Callable[[], object]:
        sized = call.out if call.op == "all_gather" else call.buf  # as the public call's
        if confirm:
            return lambda: comm.attempt(call, Ending.of(call.op, sized.nbytes, sized.dtype))
        return lambda: comm.attempt(call)

    return {
        "all_reduce": (lambda: comm.all_reduce(x), once(Call.all_reduce(x))),
        "all_gather": (lambda: comm.all_gather(part, big), once(Call.all_gather(part, big))),
        "broadcast": (lambda: comm.broadcast(x, 0), once(Call.broadcast(x, 0))),
        "reduce_scatter": (
            lambda: comm.reduce_scatter(big, part),
            once(Call.reduce_scatter(big, part)),
        ),
    }


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (op, size): each side's median GB/s, and every pair's median ratio and interval."""
    out = []
    for row in rows:
        rounds = row["rounds"]
        got: dict[str, Any] = {"op": row["op"], "size": row["size"]}
        for s in SIDES:
            got[f"gbs_{s}"] = row["size"] / statistics.median(r[s] for r in rounds) / 1e9
        for a, b in PAIRS:
            ratios = [r[a] / r[b] for r in rounds]
            low, high = bootstrap_median(ratios)
            best = min(r[a] for r in rounds) / min(r[b] for r in rounds)
            got[f"{b}/{a}"] = {"ratio": statistics.median(ratios), "ci": [low, high], "best": best}
        out.append(got)
    return out


def render(rows: list[dict[str, Any]]) -> str:
    pairs = [f"{b}/{a}" for a, b in PAIRS]
    head = f"{'op':>14} {'size':>6} " + " ".join(f"{s:>6}" for s in SIDES)
    lines = [head + "".join(f" {p + ' [95% CI] best':>32}" for p in pairs) + "   (GB/s: algbw)"]
    for row in rows:
        cells = [f"{row['op']:>14} {_size(row['size']):>6}"]
        cells += [f"{row['gbs_' + s]:>6.2f}" for s in SIDES]
        for p in pairs:
            r = row[p]
            ci = f"{r['ratio']:>8.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] {r['best']:.3f}"
            cells.append(ci.rjust(32))
        lines.append(" ".join(cells))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--min", default="1M")
    ap.add_argument("--max", default="256M")
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--rev", default="", help="run cclctl as committed at this git revision")
    ap.add_argument("--json", default="retry-cost.json")
    ap.add_argument(
        "--off-tails", action="store_true",
        help="the off blocks' links keep their tails too (what they cost, apart)",
    )  # fmt: skip
    ap.add_argument(
        "--off-confirm", action="store_true",
        help="the off blocks' calls end with a confirm too (what the rest costs, apart)",
    )  # fmt: skip
    ap.add_argument(
        "--confirm-from", default="",
        help="calls end with a confirm from this size (rerun.CONFIRM_FROM)",
    )  # fmt: skip
    ap.add_argument(
        "--two-hosts", action="store_true",
        help="half the ranks on each of two network-namespace hosts (root)",
    )  # fmt: skip
    ap.add_argument("--port", type=int, default=29950, help="--two-hosts: rank 0's store port")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return _worker(args)
    sizes = sizes_between(parse_size(args.min), parse_size(args.max), args.factor)
    load: dict[str, Any] = {"cores_before": effective_cores(), "loadavg_before": _loadavg()}
    cmd = [sys.executable, __file__, "--worker", "--ops", args.ops, "--rounds", str(args.rounds)]
    cmd += ["--confirm-from", args.confirm_from] if args.confirm_from else []
    cmd += ["--off-tails"] if args.off_tails else []
    cmd += ["--off-confirm"] if args.off_confirm else []
    cmd += ["--sizes", ",".join(map(str, sizes))]
    with tempfile.TemporaryDirectory(prefix="cclctl-rev-") as tree:
        env = {"PYTHONPATH": importing_first(export_tree(args.rev, tree))} if args.rev else {}
        out = _two_hosts(cmd, args, env) if args.two_hosts else _one_host(cmd, args, env)
    load |= {"cores_after": effective_cores(), "loadavg_after": _loadavg()}
    raw = [doc for doc in out if "op" in doc]
    parts = next((doc["parts"] for doc in out if "parts" in doc), {})
    rows = summarize(raw)
    ended = time.strftime("%H:%M:%S UTC", time.gmtime())
    rev = f", cclctl at {args.rev}" if args.rev else ""
    where = "on two hosts" if args.two_hosts else "on one host"
    print(f"# {args.ranks} ranks {where} over {parts.get('transport', '?')}, {args.rounds} "
          f"rounds{rev}; load {load}; ended {ended}")  # fmt: skip
    print(render(rows))
    print(render_parts(parts))
    doc = {
        "schema": "cclctl.retry_cost/1",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "load": load,
        "rows": rows,
        "parts": parts,
        "raw": raw,
    }
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def _size(nbytes: int) -> str:
    """``1048576`` -> ``1M``, ``1024`` -> ``1K``: the sizes as ``--min`` and ``--max`` take them."""
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


def render_parts(parts: dict[str, Any]) -> str:
    """The parts of retry's cost, each as what it adds to a call."""
    if not parts:
        return ""
    copies = ", ".join(f"{_size(int(size))} {ms:.2f} ms" for size, ms in parts["copy_ms"].items())
    return (
        f"# a confirm adds {parts['confirm_us']:.0f} us to a call (the slowest rank's median)"
        f"\n# a copy of the buffer (a kept input or result): {copies}"
    )


def _one_host(cmd: list[str], args: argparse.Namespace, env: dict[str, str]) -> list[Any]:
    """The ranks as one ``cclctl launch`` job over TCP on this host; rank 0's documents."""
    from cclctl.launch.launcher import launch

    lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
    result = launch(
        cmd,
        args.ranks,
        env={"CCLCTL_TRANSPORT": "tcp", **env},
        output=lambda rank, stream, line: lines[stream].append(f"[{rank}] {line}"),
        timeout_s=3600,
    )
    if result.returncode:
        print("\n".join(lines["stderr"][-20:]), file=sys.stderr)
        raise SystemExit(f"the ranks failed with exit code {result.returncode}")
    return [json.loads(ln.split("] ", 1)[1]) for ln in lines["stdout"] if ln.startswith("[0] {")]


def _two_hosts(cmd: list[str], args: argparse.Namespace, env: dict[str, str]) -> list[Any]:
    """The ranks half on each of two network-namespace hosts; rank 0's documents."""
    sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "support"))
    from two_hosts import rank0_lines

    lines = rank0_lines(cmd, args.ranks, args.port, env, "the retry cost benchmark")
    return [json.loads(ln) for ln in lines if ln.startswith("{")]


def _loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


if __name__ == "__main__":
    sys.exit(main())
