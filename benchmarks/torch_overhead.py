"""cclctl's process-group wrapper against plain gloo, in the same processes (asserts nothing).

Every rank instruments torch, so the world group is a cclctl wrapper around gloo, and then
makes a second, plain gloo group over the same ranks with torch's own group helper: both
groups drive the same kind of backend, side by side. Blocks of work on each are paired
round by round with an A/A control (plain against plain; see ``paired.py``), so machine
noise hits both alike and its size is printed. Measured in one run, interleaved:

- ``ddp``: one DDP training step (forward, backward with DDP's gradient all_reduces,
  gradients dropped) of a model with ``--ddp-mib`` MiB of float32 gradients; each side,
  the control included, steps two DDP instances of its own (same weights), taking turns
  block by block, made in a mirrored order, so where an instance's memory landed weighs
  on every side alike and shows in the control;
- each of ``--sizes``: a synchronous all_reduce of that many bytes.

Goals from the PyTorch integration issue: a DDP step at most 2% slower for a model with at
least 4 MiB of gradients, and at most 10 us more per all_reduce at 8 B. Every block ends
with the session's fold inside its timing, so the work the wrapper defers to its fold
thread is charged to the block that caused it. Besides the wall clock, CPU time per call is
paired the same way, of the main thread and of the whole process (gloo's threads, the fold
thread). ``--pin`` pins rank i to core i.

``--untraced`` leaves the wrapper group's calls unrecorded (a session that is not there):
what the trampoline into a Python process group costs by itself, the floor of this design.

``--wrapper`` measures the traced call alone, in this process: the wrapper's ``allreduce``
around a process group that does nothing (its work's future already completed), against
that group called directly, in CPU time: what cclctl adds to every call, free of gloo.

    python benchmarks/torch_overhead.py [--ranks 2] [--rounds 30] [--sizes 8,1M] [--ddp-mib 8]
        [--ddp-steps 4] [--pin] [--untraced] [--wrapper]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paired import pin_rank, render, run_rounds, summarize

from cclctl.benchmark.sizes import parse_size

if TYPE_CHECKING:
    from cclctl.integrations.torch.session import Session

SIZES = {8: 400, 1 << 20: 40, 4 << 20: 12, 16 << 20: 4}  # bytes -> calls per block
DDP = "ddp"


def plain_group(dist: Any) -> Any:
    """A gloo group over every rank, made with torch's own group helper: not wrapped."""
    from cclctl.integrations.torch import wrap as cclctl_torch

    state = cclctl_torch._state
    assert state is not None and state.groups.original is not None
    c10d = dist.distributed_c10d
    wrapped, c10d._new_process_group_helper = c10d._new_process_group_helper, state.groups.original
    try:
        return dist.new_group(backend="gloo")
    finally:
        c10d._new_process_group_helper = wrapped


def start_instrumented_gloo(
    pin: bool,
) -> tuple[Any, Callable[..., Any], Callable[..., Any], Session]:
    """Join the launcher's job on gloo (this rank pinned first, with ``pin``), instrumented:
    torch.distributed, a plain all_reduce (on a plain gloo group of every rank) and a
    traced one (on a wrapped group of every rank: both sides call a group that is not the
    default one, the same Python path), and the session that records the traced calls."""
    import torch.distributed as dist

    from cclctl.integrations.torch import wrap as cclctl_torch

    if pin:  # before gloo starts its threads, which inherit the mask
        pin_rank()
    cclctl_torch.instrument()
    dist.init_process_group("gloo")
    sess = cclctl_torch.session()
    assert sess is not None
    plain = functools.partial(dist.all_reduce, group=plain_group(dist))
    traced = functools.partial(dist.all_reduce, group=dist.new_group(backend="gloo"))
    return dist, plain, traced, sess


#: The order DDP instances are made in (two per side, mirrored): where an instance's
#: memory lands moves its step time by a few percent, as two plain instances show.
DDP_MADE = ("off", "on", "off2", "off2", "on", "off")


def ddp_steps(plain: Any, traced: Any, mib: int, steps: int) -> tuple[dict[str, Any], int]:
    """Each side's step function over two DDP instances of one model (``mib`` MiB of float32
    gradients in two square layers), alternating block by block: the plain group's for
    "off" and the control "off2", the wrapped group's for "on"; and the gradient bytes."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    width = int((mib * (1 << 20) / 4 / 2) ** 0.5)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, width))
    batch = torch.randn(16, width)
    groups = {"off": plain.keywords["group"], "on": traced.keywords["group"]}
    groups["off2"] = groups["off"]
    nets: dict[str, list[Any]] = {side: [] for side in groups}
    for side in DDP_MADE:
        net = DistributedDataParallel(
            torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(2))),
            process_group=groups[side],
        )
        net.module.load_state_dict(model.state_dict())
        nets[side].append(net)

    def stepper(pair: list[Any]) -> Any:
        turn = [0]

        def step() -> None:
            net = pair[turn[0] % len(pair)]
            turn[0] += 1
            for _ in range(steps):
                net(batch).sum().backward()
                net.zero_grad(set_to_none=True)

        return step

    grads = sum(p.numel() * 4 for p in model.parameters())
    return {side: stepper(pair) for side, pair in nets.items()}, grads


def _rank_main(
    rounds: int, sizes: list[int], pin: bool, mib: int, steps: int, untraced: bool
) -> None:
    import torch

    dist, plain, traced, sess = start_instrumented_gloo(pin)
    if untraced:  # the wrapper group passes every call through: its trampoline alone
        traced.keywords["group"]._cclctl_tracer.session = lambda: None
    Times = dict[str, list[float]]  # side -> seconds per call of each round's block
    results: dict[str, Times] = {}
    cpu_times: dict[str, Times] = {}
    process_times: dict[str, Times] = {}
    work: dict[str, tuple[dict[str, Callable[[], object]], int]] = {}
    if mib:
        sides, grads = ddp_steps(plain, traced, mib, steps)
        work[f"{DDP} {grads}"] = (sides, 1)
    for nbytes in sizes:
        t = torch.zeros(max(nbytes // 4, 1), dtype=torch.float32)  # sums of zeros stay zero
        calls = SIZES.get(nbytes, max(4, (16 << 20) // nbytes))
        off = functools.partial(plain, t)
        work[str(nbytes)] = ({"off": off, "on": functools.partial(traced, t), "off2": off}, calls)
    for name, (fns, calls) in work.items():
        for _ in range(6):  # every DDP instance steps at least twice
            for fn in fns.values():
                fn()

        def call_of(side: str, fns: Any = fns) -> Callable[[], object]:
            return fns[side]  # type: ignore[no-any-return]

        cpu: Times = {}
        process: Times = {}
        cpu_times[name], process_times[name] = cpu, process
        results[name] = run_rounds(
            rounds, calls, call_of, dist.barrier, cpu, settle=sess.fold, process_cpu=process
        )
    counted = sum(st.collectives for st in sess.telemetry.metrics_view().ops.values())
    rank = dist.get_rank()
    dist.destroy_process_group()
    if rank == 0:
        doc = {"sizes": results, "cpu": cpu_times, "process": process_times, "counted": counted}
        print(json.dumps(doc))


class _Nothing:
    """A process group that does nothing: its works are done before they are returned."""

    def __init__(self) -> None:
        import torch

        future = torch.futures.Future()
        future.set_result(None)
        self._work = self
        self._future = future

    def allreduce(self, *args: object) -> _Nothing:
        return self

    def wait(self) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> Any:
        return self._future


def _wrapper_cost(rounds: int, calls: int = 20000) -> None:
    import tempfile

    import torch
    import torch.distributed as dist

    from cclctl.integrations.torch import wrap as cclctl_torch
    from cclctl.integrations.torch.traced import Tracer

    store = tempfile.NamedTemporaryFile(delete=False).name  # noqa: SIM115 (gloo opens it)
    cclctl_torch.instrument()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    sess = cclctl_torch.session()
    assert sess is not None
    world = dist.distributed_c10d._get_default_group()
    nothing = _Nothing()
    tracer = Tracer(lambda: sess, nothing, torch.Tensor)
    opts = dist.AllreduceOptions()
    opts.asyncOp = False  # as dist.all_reduce passes it: the record closes at the wait
    args = ([torch.zeros(2)], opts)
    waited = sess.completions.waited  # what torch's Work.wait does while instrumented

    def traced() -> None:
        work = tracer.call("allreduce", world, args, {})
        work.wait()
        waited(work)

    sides = {"bare": lambda: nothing.allreduce(*args).wait(), "traced": traced}
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(rounds):
        for side, fn in sides.items():
            c0 = time.thread_time()
            for _ in range(calls):
                fn()
            sess.fold()
            best[side] = min(best[side], (time.thread_time() - c0) / calls)
    dist.destroy_process_group()
    os.unlink(store)
    cost = (best["traced"] - best["bare"]) * 1e6
    print(f"traced allreduce alone: {cost:.2f} us CPU per call, fold included")
    print(f"(best of {rounds} x {calls} calls, this thread)")


def _report(args: argparse.Namespace, data: dict[str, Any]) -> None:
    summary = {size: summarize(times) for size, times in data["sizes"].items()}
    cpu = {size: summarize(times) for size, times in data["cpu"].items()}
    process = {size: summarize(times) for size, times in data["process"].items()}
    pinned = ", pinned" if args.pin else ""
    print(f"gloo, {args.ranks} ranks{pinned}, {args.rounds} rounds; medians over rounds")
    print(f"rows: '{DDP} <gradient bytes>' is one DDP step, a number an all_reduce of it")
    for title, table in (
        ("wall time per call", summary),
        ("main thread's CPU time per call, same blocks", cpu),
        ("the process's CPU time per call (every thread), same blocks", process),
    ):
        print(title)
        print(_render(table))
    if args.json:
        doc = {"ranks": args.ranks, "pinned": args.pin, "sizes": summary, "cpu": cpu}
        args.json.write_text(json.dumps({**doc, "process_cpu": process}, indent=2) + "\n")
    print(f"collectives cclctl counted on rank 0: {data['counted']}")


def _render(table: dict[str, dict[str, float]]) -> str:
    """paired.render's table, with the DDP row's name in place of a size."""
    names = list(table)
    text = render({str(i): table[n] for i, n in enumerate(names)}, "plain", "cclctl")
    lines = text.splitlines()
    for i, name in enumerate(names):
        lines[i + 1] = f"{name:>16}" + lines[i + 1][10:]
    return "\n".join([" " * 6 + lines[0], *lines[1:]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--wrapper", action="store_true", help="the traced call alone, here")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    parser.add_argument("--sizes", default="8,1M", help="all_reduce sizes, e.g. 8,1M")
    parser.add_argument("--ddp-mib", type=int, default=8, help="DDP model gradients (0: none)")
    parser.add_argument("--ddp-steps", type=int, default=4, help="DDP steps per block")
    parser.add_argument("--pin", action="store_true", help="pin rank i to core i")
    parser.add_argument(
        "--untraced", action="store_true", help="the wrapper group records nothing (its floor)"
    )
    args = parser.parse_args()
    if args.wrapper:
        _wrapper_cost(args.rounds)
        return
    if "RANK" in os.environ:
        sizes = [parse_size(s, "--sizes") for s in args.sizes.split(",") if s]
        _rank_main(args.rounds, sizes, args.pin, args.ddp_mib, args.ddp_steps, args.untraced)
        return
    from cclctl.launch.launcher import launch

    out: list[str] = []
    flags = ["--rounds", str(args.rounds), "--sizes", args.sizes, "--ddp-mib", str(args.ddp_mib)]
    flags += ["--ddp-steps", str(args.ddp_steps)] + (["--pin"] if args.pin else [])
    flags += ["--untraced"] if args.untraced else []
    result = launch(
        [sys.executable, __file__, *flags],
        args.ranks,
        env={"PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"},
        capture_rank0_stdout=out.append,
    )
    if result.returncode != 0 or not out:
        sys.exit(f"benchmark ranks failed (exit {result.returncode})")
    _report(args, json.loads(out[-1]))


if __name__ == "__main__":
    main()
