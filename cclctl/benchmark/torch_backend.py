"""`cclctl bench --backend torch|gloo|nccl|torch-cclctl`: the same sweep through torch.distributed.

:class:`TorchComm` is the benchmark's communicator (numpy buffers in, as the sweep builds
them) over torch.distributed, so :class:`~cclctl.benchmark.sweep.Sweep` runs unchanged and
one table compares cclctl's runtime, gloo and NCCL. On CPU (gloo) each numpy buffer is
wrapped as a tensor without a copy, so gloo works on the sweep's own memory. On a device
(NCCL) each buffer gets a device twin: uploaded when first used or after the sweep resets
its inputs, downloaded after the one call that the check reads (see :meth:`on_device`), and
every call waits for the device, so the timed loop measures finished collectives.

torch.distributed's collectives are in place; the out-of-place forms copy the input into
the output first (all_reduce, broadcast, reduce), which the timing includes.

``torch-cclctl`` is torch.distributed's ``cclctl`` backend (``import cclctl.torch``
registers it): cclctl's runtime behind torch's API, the backend a PyTorch job runs on, so
one table compares it with gloo and with the runtime called directly (``cclctl``).
"""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np

from cclctl.benchmark.catalog import BACKENDS
from cclctl.benchmark.collectives import Placement
from cclctl.config import in_launched_job, rendezvous_from_env
from cclctl.errors import UsageError

_REDOPS = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX", "avg": "AVG"}
#: bench's name -> torch.distributed's, where they differ
_DIST_NAMES = {"torch-cclctl": "cclctl"}

Array = np.ndarray


def resolve(backend: str) -> str:
    """torch.distributed's backend name: ``torch`` -> ``nccl`` where CUDA is available, else
    ``gloo``; ``torch-cclctl`` -> ``cclctl``; others as given."""
    if backend not in BACKENDS:
        raise UsageError(
            f"--backend {backend!r} is not one of {', '.join(BACKENDS)}", flag="--backend"
        )
    if backend != "torch":
        return _DIST_NAMES.get(backend, backend)
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def connect(backend: str, timeout_s: float | None = None, **telemetry: Any) -> TorchComm:
    """Join the launched job through torch.distributed (env://). ``timeout_s`` (bench's -T)
    bounds each collective; ``telemetry`` (runtime settings such as ``metrics_port``)
    instruments torch.distributed with cclctl first, except on the ``cclctl`` backend, whose
    calls are cclctl's own records already (it takes its settings from ``CCLCTL_*``).
    """
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise UsageError(
            "--backend torch needs PyTorch: pip install 'cclctl[torch]'", flag="--backend"
        ) from None
    name = resolve(backend)
    device = None
    if name == "nccl":
        if not torch.cuda.is_available():
            raise UsageError("--backend nccl needs CUDA devices", flag="--backend")
        local = rendezvous_from_env().local_rank if in_launched_job() else 0
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    if name == "cclctl":  # what `import cclctl.torch` does
        from cclctl.integrations.torch.backend.registration import register

        register()
    elif telemetry:
        from cclctl.integrations.torch.wrap import instrument

        instrument(**telemetry)
    timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(name, device_id=device, timeout=timeout)  # None: torch's default
    label = backend if name == "cclctl" else name  # torch-cclctl, not the runtime's cclctl
    return TorchComm(dist, label, device)


class TorchComm:
    """The benchmark's :class:`~cclctl.benchmark.collectives.Communicator` over torch."""

    def __init__(self, dist: Any, backend: str, device: Any = None) -> None:
        import torch

        self._torch = torch
        self._dist = dist
        self.backend = backend
        self.device = device  # None: CPU tensors over the numpy buffers themselves
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._twins: dict[int, tuple[Array, Any]] = {}  # id(buffer) -> (buffer, device twin)
        self._once: dict[int, tuple[Array, Any]] = {}  # twins of a call outside placements
        self._fresh: set[int] = set()  # twins uploaded since the last reset
        self._in_placement = False  # inside a wrapped placement's run (twins persist)
        self._download = False  # the current call's buffers go back to the host

    # -- buffers ------------------------------------------------------------------------

    def _cpu(self, arr: Array) -> Any:
        if arr.dtype.kind == "V":  # ml_dtypes' bfloat16: same bits as torch.bfloat16
            return self._torch.from_numpy(arr.view(np.int16)).view(self._torch.bfloat16)
        return self._torch.from_numpy(arr)

    def _tensor(self, arr: Array) -> Any:
        """A tensor over ``arr`` (CPU) or its device twin, current with the host. Outside a
        placement (the sweep's own small reductions) a twin lasts for one call only.
        """
        if self.device is None:
            return self._cpu(arr)
        twins = self._twins if self._in_placement else self._once
        key = id(arr)
        held = twins.get(key)
        if held is None or held[0] is not arr:
            held = twins[key] = (arr, self._cpu(arr).to(self.device, copy=True))
            self._fresh.add(key)
        elif key not in self._fresh:
            held[1].copy_(self._cpu(arr))
            self._fresh.add(key)
        return held[1]

    def _done(self, *outputs: Array) -> None:
        """After a call on a device: wait for it, and bring results home when needed."""
        if self.device is None:
            return
        if self.device.type == "cuda":
            self._torch.cuda.synchronize(self.device)
        if self._in_placement and not self._download:
            return
        twins = self._twins if self._in_placement else self._once
        for arr in outputs:
            self._cpu(arr).copy_(twins[id(arr)][1])
        if not self._in_placement:
            self._fresh.difference_update(self._once)
            self._once.clear()

    def on_device(self, placement: Placement) -> Placement:
        """Wrap a sweep placement so its buffers live on the device between resets.

        A reset rewrites the host inputs: every twin is uploaded again at its next use, and
        the call after a reset (the one the check reads) downloads its buffers.
        """
        if self.device is None:
            return placement
        self._twins.clear()
        self._fresh.clear()

        def reset() -> None:
            placement.reset()
            self._fresh.clear()
            self._download = True

        def run() -> object:
            self._in_placement = True
            try:
                return placement.run()
            finally:
                self._in_placement = self._download = False

        return Placement(run, reset, placement.result)

    def _copy(self, target: Array, source: Array) -> Any:
        """``target = source`` where the data lives (the host, or the device twins)."""
        if self.device is None:
            target[...] = source
            return self._cpu(target)
        tensor = self._tensor(target)
        tensor.copy_(self._tensor(source))
        return tensor

    def _op(self, redop: str) -> Any:
        return getattr(self._dist.ReduceOp, _REDOPS[redop])

    # -- collectives ----------------------------------------------------------------------

    def all_reduce(self, buf: Array, op: str = "sum", out: Array | None = None) -> Array:
        target = buf if out is None else out
        tensor = self._tensor(target) if target is buf else self._copy(target, buf)
        self._dist.all_reduce(tensor, op=self._op(op))
        self._done(target)
        return target

    def all_gather(self, buf: Array, out: Array) -> Array:
        gather = getattr(self._dist, "all_gather_single", None) or self._dist.all_gather_into_tensor
        gather(self._tensor(out), self._tensor(buf))
        self._done(out)
        return out

    def reduce_scatter(self, buf: Array, out: Array, op: str = "sum") -> Array:
        scatter = (
            getattr(self._dist, "reduce_scatter_single", None) or self._dist.reduce_scatter_tensor
        )
        scatter(self._tensor(out), self._tensor(buf), op=self._op(op))
        self._done(out)
        return out

    def broadcast(self, buf: Array, root: int = 0, out: Array | None = None) -> Array:
        target = buf if out is None else out
        copy = target is not buf and self.rank == root
        tensor = self._copy(target, buf) if copy else self._tensor(target)
        self._dist.broadcast(tensor, src=root)
        self._done(target)
        return target

    def reduce(self, buf: Array, op: str = "sum", root: int = 0, out: Array | None = None) -> Array:
        target = buf if out is None else out
        tensor = self._tensor(target) if target is buf else self._copy(target, buf)
        self._dist.reduce(tensor, dst=root, op=self._op(op))
        self._done(target)
        return target

    def all_to_all(self, buf: Array, out: Array) -> Array:
        src = self._tensor(buf)
        if np.shares_memory(buf, out):  # torch would read what it is writing
            src = src.clone()
        self._dist.all_to_all_single(self._tensor(out), src)
        self._done(out)
        return out

    def send(self, buf: Array, dst: int) -> None:
        self._dist.send(self._tensor(buf), dst)
        self._done()

    def recv(self, buf: Array, src: int) -> Array:
        self._dist.recv(self._tensor(buf), src)
        self._done(buf)
        return buf

    def barrier(self) -> None:
        self._dist.barrier()

    def close(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()
        self._twins.clear()
