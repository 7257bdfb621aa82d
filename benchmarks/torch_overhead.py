"""Instrumented vs plain gloo all_reduce, in the same processes (asserts nothing).

Each rank keeps torch's own ``all_reduce`` and, after ``cclctl.integrations.torch.wrap
.instrument()``, the wrapped one; both drive the same process group. Blocks of calls are
paired round by round with an A/A control (see ``paired.py``), so machine noise hits both
alike and its size is printed. Goals from the PyTorch integration issue: at most 2% slower
from 1 MiB up, at most 10 us more per call at 8 B.

With ``--ranks 1`` gloo's all_reduce does no communication, which isolates the wrapper's
own cost per call from the noise of the network path.

``--wrapper`` measures the wrappers alone, in this process: the wrapped all_reduce around a
function that does nothing, against that function, in CPU time, for the quick path (a
synchronous call on a CPU tensor) and the general one (everything else). That is the cost
cclctl adds to every call, free of gloo's noise.

``--paths`` compares the two paths of the wrapper in the same processes: the general one,
which every call took before the quick path existed, is the baseline ("off"), the quick
one is measured ("on").

Every block ends with the session's fold, inside its timing. The wrapper defers building
and counting records to the session's fold thread, which wakes every 100 ms, so without it
an "on" block's records were mostly counted during the next block, whichever side that
was: the fold's cost went uncharged, or charged to "off" (measured: the A/A control read
+2.8 us of process CPU at 8 B without it, +0.2 us with it).

Besides the wall clock, CPU time per call is paired the same way, of the main thread and
of the whole process (gloo's threads and the fold thread too). At 8 B a gloo call mostly
waits, and its wall time swings by more than the goal; the CPU cclctl adds there, in the
real run with cold caches, is the steadier figure (several times the ``--wrapper`` one,
which runs warm). ``--pin`` pins rank i to core i (all its threads, gloo's and cclctl's
too), which takes the scheduler's migrations out of the noise, and makes the fold thread
share the rank's core: its work then adds to the wall time.

    python benchmarks/torch_overhead.py [--ranks 2] [--rounds 30] [--pin] [--wrapper] [--paths]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paired import pin_rank, render, run_rounds, summarize

from cclctl.benchmark.sizes import parse_size
from cclctl.integrations.torch.calls import describer, quick_layout

if TYPE_CHECKING:
    from cclctl.integrations.torch.session import Session

PATHS_HELP = "compare the wrapper's quick path (on) with its general path (off)"
SIZES = {8: 400, 1 << 20: 40, 4 << 20: 12, 16 << 20: 4}  # bytes -> calls per block


def start_instrumented_gloo(
    pin: bool,
) -> tuple[Any, Callable[..., Any], Callable[..., Any], Session]:
    """Join the launcher's job on gloo (this rank pinned first, with ``pin``) and instrument
    it: torch.distributed, its plain all_reduce and the wrapped one (both usable), and the
    cclctl session that records the wrapped calls."""
    import torch.distributed as dist

    from cclctl.integrations.torch import wrap as cclctl_torch

    if pin:  # before gloo starts its threads, which inherit the mask
        pin_rank()
    dist.init_process_group("gloo")
    plain = dist.all_reduce
    cclctl_torch.instrument()
    traced = dist.all_reduce
    sess = cclctl_torch.session()
    assert traced is not plain and sess is not None
    return dist, plain, traced, sess


def python_wrappers(
    target: Callable[..., Any], like: Callable[..., Any]
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The general and the quick wrapper of all_reduce around ``target``, read
    by the signature of ``like`` (torch's all_reduce), reporting to the live session."""
    import torch
    from cclctl.integrations.torch.wrappers import wrap_general, wrap_quick

    from cclctl.integrations.torch import wrap as cclctl_torch

    state, layout = cclctl_torch._state, quick_layout("all_reduce", like)
    assert state is not None and layout is not None
    general = wrap_general(state, target, describer("all_reduce", like, torch.Tensor))
    quick = wrap_quick(state, target, "all_reduce", layout, torch.Tensor, general)
    return general, quick


def _rank_main(rounds: int, sizes: list[int], paths: bool, pin: bool) -> None:
    import torch

    dist, plain, traced, sess = start_instrumented_gloo(pin)
    if paths:  # the general wrapper is the baseline, the quick one what is measured
        plain = python_wrappers(plain, plain)[0]
    wanted = {size: SIZES.get(size, max(4, (16 << 20) // size)) for size in sizes}
    calls_of = wanted if dist.get_world_size() > 1 else dict.fromkeys(wanted, 4000)
    Times = dict[str, list[float]]  # side -> seconds per call of each round's block
    results: dict[int, Times] = {}
    cpu_times: dict[int, Times] = {}
    process_times: dict[int, Times] = {}
    for nbytes, calls in calls_of.items():
        t = torch.zeros(max(nbytes // 4, 1), dtype=torch.float32)  # sums of zeros stay zero
        for _ in range(3):
            plain(t)

        def call_of(side: str, t: torch.Tensor = t) -> Callable[[], object]:
            fn = traced if side == "on" else plain
            return lambda: fn(t)

        cpu: Times = {}
        process: Times = {}
        cpu_times[nbytes], process_times[nbytes] = cpu, process
        results[nbytes] = run_rounds(
            rounds, calls, call_of, dist.barrier, cpu, settle=sess.fold, process_cpu=process
        )
    recorded = sess.telemetry.metrics_view().ops
    counted = sum(st.collectives for st in recorded.values())
    rank = dist.get_rank()
    dist.destroy_process_group()
    if rank == 0:
        print(
            json.dumps(
                {"sizes": results, "cpu": cpu_times, "process": process_times, "counted": counted}
            )
        )


def _wrapper_cost(rounds: int, calls: int = 20000) -> None:
    import tempfile

    import torch
    import torch.distributed as dist

    from cclctl.integrations.torch import wrap as cclctl_torch

    store = tempfile.NamedTemporaryFile(delete=False).name  # noqa: SIM115 (gloo opens it)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    real = dist.all_reduce
    cclctl_torch.instrument()
    state = cclctl_torch._state
    assert state is not None

    def nothing(*args: object, **kwargs: object) -> None:
        return None

    general, quick = python_wrappers(nothing, real)
    t = torch.zeros(2)
    sides = {"bare": nothing, "general": general, "quick": quick}
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(rounds):
        for side, fn in sides.items():
            c0 = time.thread_time()
            for _ in range(calls):
                fn(t)
            best[side] = min(best[side], (time.thread_time() - c0) / calls)
    dist.destroy_process_group()
    os.unlink(store)
    for side in [s for s in sides if s != "bare"]:
        cost = (best[side] - best["bare"]) * 1e6
        print(
            f"{side} wrapper alone: {cost:.2f} us CPU per call (best of {rounds} x {calls} calls)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--wrapper", action="store_true", help="the wrapper alone, here")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    parser.add_argument("--sizes", default="8,1M,4M,16M", help="message sizes, e.g. 8,1M")
    parser.add_argument("--paths", action="store_true", help=PATHS_HELP)
    parser.add_argument("--pin", action="store_true", help="pin rank i to core i")
    args = parser.parse_args()
    if args.wrapper:
        _wrapper_cost(args.rounds)
        return
    if "RANK" in os.environ:
        sizes = [parse_size(s, "--sizes") for s in args.sizes.split(",")]
        _rank_main(args.rounds, sizes, args.paths, args.pin)
        return
    from cclctl.launch.launcher import launch

    out: list[str] = []
    result = launch(
        [sys.executable, __file__, "--rounds", str(args.rounds), "--sizes", args.sizes]
        + (["--paths"] if args.paths else [])
        + (["--pin"] if args.pin else []),
        args.ranks,
        env={"PYTHONWARNINGS": "ignore"},
        capture_rank0_stdout=out.append,
    )
    if result.returncode != 0 or not out:
        sys.exit(f"benchmark ranks failed (exit {result.returncode})")
    data = json.loads(out[-1])
    summary = {size: summarize(times) for size, times in data["sizes"].items()}
    cpu = {size: summarize(times) for size, times in data["cpu"].items()}
    process = {size: summarize(times) for size, times in data["process"].items()}
    sides = ("general", "quick") if args.paths else ("plain", "cclctl")
    pinned = ", pinned" if args.pin else ""
    print(f"gloo all_reduce, {args.ranks} ranks{pinned}, {args.rounds} rounds; medians over rounds")
    print(render(summary, *sides))
    print("main thread's CPU time per call, same blocks")
    print(render(cpu, *sides))
    print("the process's CPU time per call (every thread), same blocks")
    print(render(process, *sides))
    if args.json:
        doc = {
            "ranks": args.ranks,
            "pinned": args.pin,
            "sizes": summary,
            "cpu": cpu,
            "process_cpu": process,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"collectives cclctl counted on rank 0: {data['counted']}")


if __name__ == "__main__":
    main()
