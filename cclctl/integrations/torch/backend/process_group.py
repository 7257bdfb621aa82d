"""The ``cclctl`` process group: torch's collectives, run on cclctl's runtime communicator.

A Python ``ProcessGroup`` (torch calls its methods from Python, and the ones its C++
trampoline forwards from C++: DDP's reducer, its parameter broadcast and shape checks).
Each method turns torch's arguments into views (:mod:`.relayed` decides whether a call's
tensors are host views, copied to the host whole, or go through the group's relay), queues
the call on its lane of the group's progress (:mod:`.progress`: collectives in issue order,
point-to-point calls per peer and direction) and returns its
:class:`~.work.CclctlWork`. The calls run on the runtime's
:class:`~cclctl.runtime.comm.communicator.Communicator`, so they are cclctl's own records:
telemetry, ``cclctl top`` and ``cclctl diagnose hang`` see them as they see any job's.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import torch
import torch.distributed as dist

from cclctl.errors import InvalidArgument
from cclctl.integrations.torch.backend import ops
from cclctl.integrations.torch.backend.blocks import BlockExchange
from cclctl.integrations.torch.backend.ops import Collectives, View
from cclctl.integrations.torch.backend.progress import COLLECTIVE, Progress
from cclctl.integrations.torch.backend.relayed import Placement
from cclctl.integrations.torch.backend.views import HostView, redop
from cclctl.integrations.torch.backend.work import CclctlWork
from cclctl.runtime.comm.communicator import Communicator

NAME = "cclctl"
Tensors = list[torch.Tensor]


def _reduction(opts: Any, call: str) -> str:
    """The reduction of ``opts`` (torch passes options, or a bare ``ReduceOp``)."""
    op = getattr(opts, "reduceOp", opts)
    return "sum" if op is None else redop(op, call)


def _root(opts: Any) -> int:
    return int(getattr(opts, "rootRank", 0) if opts is not None else 0)


def _splits(splits: list[int], tensor: torch.Tensor, n: int, name: str) -> list[int]:
    """Rows per rank of ``tensor``: ``splits``, checked, or (empty) equal blocks."""
    rows = tensor.shape[0] if tensor.dim() else 1
    if not splits:
        if rows % n:
            raise InvalidArgument(
                f"all_to_all: no {name} splits, and the {name}'s {rows} rows are not a "
                f"multiple of the world size {n}",
                op="all_to_all",
            )
        return [rows // n] * n
    if len(splits) != n or any(s < 0 for s in splits) or sum(splits) != rows:
        raise InvalidArgument(
            f"all_to_all: {name} splits {splits} must be {n} non-negative row counts summing "
            f"to the {name}'s {rows} rows",
            op="all_to_all",
        )
    return list(splits)


#: torch's ProcessGroup, whose stubs type its overloads, not the trampoline's Python methods
_ProcessGroup: Any = dist.ProcessGroup


class CclctlProcessGroup(_ProcessGroup):
    """A torch process group whose calls run on one cclctl communicator."""

    def __init__(self, comm: Communicator) -> None:
        super().__init__(comm.rank, comm.world_size)
        self.comm = comm
        self._blocks = BlockExchange(comm)  # all_to_all of blocks of any sizes
        self._progress = Progress(f"cclctl-pg {comm.id}")
        self._placement = Placement(comm)
        self._names: dict[str, str] = {}

    def getBackendName(self) -> str:  # torch's C++ name
        return NAME

    # torch names a group after creating it; its C++ side reads the name (functional
    # collectives, FSDP find the group by it), which a group with no C++ backend keeps here
    def setGroupName(self, name: str) -> None:
        self._names["name"] = name

    def getGroupName(self) -> str:
        return self._names.get("name", "")

    def setGroupDesc(self, desc: str) -> None:
        self._names["desc"] = desc

    def getGroupDesc(self) -> str:
        return self._names.get("desc", "")

    def _issue(
        self, op: str, job: ops.Job, opts: Any = None, lane: Hashable = COLLECTIVE
    ) -> CclctlWork:
        """Queue ``job`` on ``lane`` (point-to-point calls: their peer's and direction's);
        a call torch waits on at once (``opts.asyncOp`` false: ``async_op=False``) runs
        here when nothing is before it."""
        now = not getattr(opts, "asyncOp", True)
        return CclctlWork(self._progress.submit(job, lane, now=now), op, self._progress)

    def _views(self, tensors: Tensors, call: str, *, reduces: bool = False) -> list[HostView]:
        """Host views, for the calls the relay does not have (a staged tensor copied whole)."""
        return self._placement.host(tensors, call, reduces=reduces)

    def _placed(
        self, tensors: Tensors, call: str, *, reduces: bool = False
    ) -> tuple[Collectives, list[View]]:
        """What runs a call the relay has (the communicator or the group's relay), and views."""
        return self._placement.direct(tensors, call, reduces=reduces)

    # ----------------------------------------------------------------- reductions
    def allreduce(self, tensors: Tensors, opts: Any = None) -> CclctlWork:
        op = _reduction(opts, "all_reduce")
        comm, views = self._placed(tensors, "all_reduce", reduces=True)
        return self._issue("all_reduce", ops.all_reduce(comm, views, op), opts)

    def allreduce_coalesced(self, tensors: Tensors, opts: Any = None) -> CclctlWork:
        return self.allreduce(tensors, opts)  # one runtime call per tensor, in order

    def reduce(self, tensors: Tensors, opts: Any = None) -> CclctlWork:
        op = _reduction(opts, "reduce")
        comm, views = self._placed(tensors, "reduce", reduces=True)
        return self._issue("reduce", ops.reduce(comm, views, op, _root(opts)), opts)

    def reduce_scatter(
        self, outputs: Tensors, inputs: list[Tensors], opts: Any = None
    ) -> CclctlWork:
        op = _reduction(opts, "reduce_scatter")
        if len(outputs) != 1 or len(inputs) != 1:
            raise InvalidArgument("reduce_scatter: one output tensor per call", op="reduce_scatter")
        out = self._views(outputs, "reduce_scatter", reduces=True)[0]
        srcs = self._views(inputs[0], "reduce_scatter", reduces=True)
        return self._issue(
            "reduce_scatter", ops.reduce_scatter_list(self.comm, out, srcs, op), opts
        )

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> CclctlWork:
        return self.reduce_scatter_single_coalesced([output], [input], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: Tensors, inputs: Tensors, opts: Any = None
    ) -> CclctlWork:
        op = _reduction(opts, "reduce_scatter")
        comm, views = self._placed([*outputs, *inputs], "reduce_scatter", reduces=True)
        pairs = list(zip(views[: len(outputs)], views[len(outputs) :], strict=True))
        return self._issue("reduce_scatter", ops.reduce_scatter(comm, pairs, op), opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ----------------------------------------------------------------- data movement
    def broadcast(self, tensors: Tensors, opts: Any = None) -> CclctlWork:
        comm, views = self._placed(tensors, "broadcast")
        return self._issue("broadcast", ops.broadcast(comm, views, _root(opts)), opts)

    def allgather(self, outputs: list[Tensors], inputs: Tensors, opts: Any = None) -> CclctlWork:
        if len(outputs) != 1 or len(inputs) != 1:
            raise InvalidArgument("all_gather: one input tensor per call", op="all_gather")
        outs = self._views(outputs[0], "all_gather")
        src = self._views(inputs, "all_gather")[0]
        return self._issue("all_gather", ops.all_gather_list(self.comm, outs, src), opts)

    def allgather_coalesced(
        self, outputs: list[Tensors], inputs: Tensors, opts: Any = None
    ) -> CclctlWork:
        srcs = self._views(inputs, "all_gather")
        pairs = zip(outputs, srcs, strict=True)
        jobs = [ops.all_gather_list(self.comm, self._views(o, "all_gather"), s) for o, s in pairs]
        return self._issue("all_gather", lambda: [t for job in jobs for t in job()], opts)

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> CclctlWork:
        return self.all_gather_single_coalesced([output], [input], opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: Tensors, inputs: Tensors, opts: Any = None
    ) -> CclctlWork:
        comm, views = self._placed([*outputs, *inputs], "all_gather")
        pairs = list(zip(views[: len(outputs)], views[len(outputs) :], strict=True))
        return self._issue("all_gather", ops.all_gather(comm, pairs), opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,  # torch's name
        output_splits: list[int],
        input_splits: list[int],
        opts: Any = None,
    ) -> CclctlWork:
        n = self.comm.world_size
        if not output_splits and not input_splits:  # equal blocks, on every rank
            comm, (out, src) = self._placed([output, input], "all_to_all")
            return self._issue("all_to_all", ops.all_to_all(comm, out, src), opts)
        # splits: the blocks may differ on other ranks even where they are equal here, so
        # every rank given splits makes one all_to_allv (blocks.py), as gloo its alltoallv
        out, src = self._views([output, input], "all_to_all")
        row = math.prod(input.shape[1:])  # elements per row of dim 0 (both tensors')
        out_counts = [s * row for s in _splits(output_splits, output, n, "output")]
        in_counts = [s * row for s in _splits(input_splits, input, n, "input")]
        job = ops.all_to_all_uneven(self._blocks, out, src, out_counts, in_counts)
        return self._issue("all_to_all", job, opts)

    alltoall_base = all_to_all_single

    def alltoall(self, outputs: Tensors, inputs: Tensors, opts: Any = None) -> CclctlWork:
        outs = self._views(outputs, "all_to_all")
        srcs = self._views(inputs, "all_to_all")
        return self._issue("all_to_all", ops.all_to_all_list(self._blocks, outs, srcs), opts)

    def gather(self, outputs: list[Tensors], inputs: Tensors, opts: Any = None) -> CclctlWork:
        root = _root(opts)
        outs = self._views(outputs[0] if outputs else [], "gather")
        src = self._views(inputs, "gather")[0]
        return self._issue("gather", ops.gather(self.comm, outs, src, root), opts)

    def scatter(self, outputs: Tensors, inputs: list[Tensors], opts: Any = None) -> CclctlWork:
        root = _root(opts)
        out = self._views(outputs, "scatter")[0]
        srcs = self._views(inputs[0] if inputs else [], "scatter")
        return self._issue("scatter", ops.scatter(self.comm, out, srcs, root), opts)

    def recv_anysource(self, tensors: Tensors, tag: int = 0) -> CclctlWork:
        raise InvalidArgument(
            "recv: cclctl's runtime receives from a named rank only (no source given)", op="recv"
        )

    def barrier(self, opts: Any = None) -> CclctlWork:
        return self._issue("barrier", ops.barrier(self.comm), opts)

    def send(self, tensors: Tensors, dst: int, tag: int = 0) -> CclctlWork:
        views = self._views(tensors, "send")
        return self._issue("send", ops.send(self.comm, views, dst), lane=("send", dst))

    def recv(self, tensors: Tensors, src: int, tag: int = 0) -> CclctlWork:
        views = self._views(tensors, "recv")
        return self._issue("recv", ops.recv(self.comm, views, src), lane=("recv", src))

    # ----------------------------------------------------------------- lifecycle
    def shutdown(self) -> None:
        """``destroy_process_group``: run what was issued, then close the communicator."""
        try:
            self._progress.close()
        finally:
            self.comm.close()

    def abort(self) -> None:
        """Fail every blocked and later call at once, then close."""
        self.comm.abort("the cclctl process group was aborted")
        self.shutdown()
