"""Instrumented vs plain gloo all_reduce, in the same processes (asserts nothing).

Each rank keeps torch's own ``all_reduce`` and, after ``cclctl.integrations.torch
.instrument()``, the wrapped one; both drive the same process group. Blocks of calls
alternate between the two (neither side always goes first), and the best block of each side
is compared, so machine noise hits both alike. Goals from the PyTorch integration issue: at
most 2% slower from 1 MiB up, at most 10 us more per call at 8 B.

With ``--ranks 1`` gloo's all_reduce does no communication, which isolates the wrapper's
own cost per call from the noise of the network path. The calling thread's CPU time per
call is reported beside the wall time: the wrapper runs in that thread, and CPU time does
not count the time the thread waits for the CPU on a busy machine.

``--wrapper`` measures the wrapper alone, in this process: the wrapped all_reduce around a
function that does nothing, against that function, in CPU time. That is the cost cclctl
adds to every call, free of gloo's noise.

    python benchmarks/torch_overhead.py [--ranks 2] [--rounds 7] [--wrapper]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

SIZES = {8: 400, 1 << 20: 40, 4 << 20: 12, 16 << 20: 4}  # bytes -> calls per block


def _rank_main(rounds: int) -> None:
    import torch
    import torch.distributed as dist

    from cclctl.integrations import torch as cclctl_torch

    dist.init_process_group("gloo")
    plain = dist.all_reduce
    cclctl_torch.instrument()
    traced = dist.all_reduce
    assert traced is not plain and cclctl_torch.session() is not None
    calls_of = SIZES if dist.get_world_size() > 1 else dict.fromkeys(SIZES, 4000)
    results = {}
    for nbytes, calls in calls_of.items():
        t = torch.zeros(max(nbytes // 4, 1), dtype=torch.float32)  # sums of zeros stay zero
        best = dict.fromkeys(("off", "on", "off_cpu", "on_cpu"), float("inf"))
        for round_no in range(rounds):
            order = ("off", "on") if round_no % 2 else ("on", "off")
            for side in order:
                fn = traced if side == "on" else plain
                plain(t)  # line the ranks up, untimed
                t0, c0 = time.perf_counter(), time.thread_time()
                for _ in range(calls):
                    fn(t)
                cpu = (time.thread_time() - c0) / calls
                best[side] = min(best[side], (time.perf_counter() - t0) / calls)
                best[side + "_cpu"] = min(best[side + "_cpu"], cpu)
        results[nbytes] = best
    recorded = cclctl_torch.session().telemetry.metrics_view().ops  # type: ignore[union-attr]
    counted = sum(st.collectives for st in recorded.values())
    rank = dist.get_rank()
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"sizes": {str(k): v for k, v in results.items()}, "counted": counted}))


def _wrapper_cost(rounds: int, calls: int = 20000) -> None:
    import tempfile

    import torch
    import torch.distributed as dist

    from cclctl.integrations import torch as cclctl_torch
    from cclctl.integrations.torch_calls import describer

    store = tempfile.NamedTemporaryFile(delete=False).name  # noqa: SIM115 (gloo opens it)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    real = dist.all_reduce
    cclctl_torch.instrument()
    state = cclctl_torch._state
    assert state is not None

    def nothing(*args: object, **kwargs: object) -> None:
        return None

    wrapped = cclctl_torch._wrap(state, nothing, describer("all_reduce", real, torch.Tensor))
    t = torch.zeros(2)
    best = {"bare": float("inf"), "wrapped": float("inf")}
    for _ in range(rounds):
        for side, fn in (("bare", nothing), ("wrapped", wrapped)):
            c0 = time.thread_time()
            for _ in range(calls):
                fn(t)
            best[side] = min(best[side], (time.thread_time() - c0) / calls)
    dist.destroy_process_group()
    os.unlink(store)
    cost = (best["wrapped"] - best["bare"]) * 1e6
    print(f"wrapper alone: {cost:.2f} us CPU per call (best of {rounds} x {calls} calls)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--wrapper", action="store_true", help="the wrapper alone, here")
    args = parser.parse_args()
    if args.wrapper:
        _wrapper_cost(args.rounds)
        return
    if "RANK" in os.environ:
        _rank_main(args.rounds)
        return
    from cclctl.runtime.launcher import launch

    out: list[str] = []
    result = launch(
        [sys.executable, __file__, "--rounds", str(args.rounds)],
        args.ranks,
        env={"PYTHONWARNINGS": "ignore"},
        capture_rank0_stdout=out.append,
    )
    if result.returncode != 0 or not out:
        sys.exit(f"benchmark ranks failed (exit {result.returncode})")
    data = json.loads(out[-1])
    print(f"gloo all_reduce, {args.ranks} ranks, best of {args.rounds} blocks per side")
    print(
        f"{'size':>10} {'plain (us)':>11} {'cclctl (us)':>12} {'delta (us)':>11} "
        f"{'delta %':>8} {'CPU delta (us)':>15}"
    )
    for size, best in data["sizes"].items():
        off, on = best["off"] * 1e6, best["on"] * 1e6
        cpu = (best["on_cpu"] - best["off_cpu"]) * 1e6
        pct = 100 * (on - off) / off
        print(
            f"{int(size):>10} {off:>11.1f} {on:>12.1f} {on - off:>11.2f} {pct:>7.2f}% {cpu:>15.2f}"
        )
    print(f"collectives cclctl counted on rank 0: {data['counted']}")


if __name__ == "__main__":
    main()
