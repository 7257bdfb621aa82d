"""The collectives a cclctl process group runs, on host views of torch's tensors.

Each function takes the views (made on the caller's thread, when torch issues the call, so
an input copied in is the tensor as it was then) and returns the job its progress thread
runs: one or more calls on the runtime's communicator (the calls its telemetry records),
the copies out that views need, and the output tensors the call's future holds. torch's
list forms (``all_gather`` into a list, ``reduce_scatter`` from one) go through one
contiguous buffer, so each is one runtime call.

The collectives the relay has (all_reduce, broadcast, reduce, all_gather, reduce_scatter,
all_to_all of equal blocks) run on any :class:`Collectives` with :class:`View`'s: the
communicator on host views, or the group's
:class:`~cclctl.integrations.torch.relay_copier.TensorRelay` on flat tensors
(:mod:`.relayed` says which); the others take the communicator and host views only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from cclctl.errors import InvalidArgument
from cclctl.integrations.torch.backend.blocks import BlockExchange, cut
from cclctl.integrations.torch.backend.views import HostView
from cclctl.runtime.comm.communicator import Communicator

Job = Callable[[], list[torch.Tensor]]


class View(Protocol):
    """A tensor as the buffer a :class:`Collectives` runs on (``array``), and the copy back
    into the tensor once the call ends."""

    tensor: torch.Tensor
    array: Any

    def write_back(self) -> None: ...


class Collectives(Protocol):
    """The calls the relay has, as the communicator and the torch relay both take them."""

    def all_reduce(self, buf: Any, op: str, /) -> Any: ...
    def broadcast(self, buf: Any, root: int, /) -> Any: ...
    def reduce(self, buf: Any, op: str, root: int, /) -> Any: ...
    def all_gather(self, buf: Any, out: Any, /) -> Any: ...
    def reduce_scatter(self, buf: Any, out: Any, op: str, /) -> Any: ...
    def all_to_all(self, buf: Any, out: Any, /) -> Any: ...


def _done(views: Sequence[View]) -> list[torch.Tensor]:
    for view in views:
        view.write_back()
    return [view.tensor for view in views]


def all_reduce(comm: Collectives, views: Sequence[View], redop: str) -> Job:
    def run() -> list[torch.Tensor]:
        for view in views:
            comm.all_reduce(view.array, redop)
        return _done(views)

    return run


def broadcast(comm: Collectives, views: Sequence[View], root: int) -> Job:
    def run() -> list[torch.Tensor]:
        for view in views:
            comm.broadcast(view.array, root)
        return _done(views)

    return run


def reduce(comm: Collectives, views: Sequence[View], redop: str, root: int) -> Job:
    def run() -> list[torch.Tensor]:
        for view in views:
            comm.reduce(view.array, redop, root)
        return _done(views)

    return run


def all_gather(comm: Collectives, pairs: Sequence[tuple[View, View]]) -> Job:
    """``pairs``: (output of ``world_size`` blocks, input) each."""

    def run() -> list[torch.Tensor]:
        for out, src in pairs:
            comm.all_gather(src.array, out.array)
        return _done([out for out, _ in pairs])

    return run


def all_gather_list(comm: Communicator, outs: list[HostView], src: HostView) -> Job:
    """torch's list form: the blocks land in one buffer, then in each output tensor."""

    def run() -> list[torch.Tensor]:
        whole = np.empty(src.array.size * len(outs), dtype=src.array.dtype)
        comm.all_gather(src.array, whole)
        for out, block in zip(outs, np.split(whole, len(outs)), strict=True):
            out.array[...] = block
        return _done(outs)

    return run


def gather(comm: Communicator, outs: list[HostView], src: HostView, root: int) -> Job:
    """To ``root`` (``outs``: its blocks; empty elsewhere): an all_gather the root keeps,
    the runtime having no gather of its own (the other ranks' copies are dropped)."""

    def run() -> list[torch.Tensor]:
        whole = np.empty(src.array.size * comm.world_size, dtype=src.array.dtype)
        comm.all_gather(src.array, whole)
        if comm.rank == root:
            for out, block in zip(outs, np.split(whole, comm.world_size), strict=True):
                out.array[...] = block
        return _done(outs)

    return run


def scatter(comm: Communicator, out: HostView, srcs: list[HostView], root: int) -> Job:
    """From ``root`` (``srcs``: its blocks; empty elsewhere): a broadcast of the joined
    blocks, of which each rank keeps its own, the runtime having no scatter of its own."""
    size = out.array.size * comm.world_size
    whole = np.concatenate([s.array for s in srcs]) if srcs else np.empty(size, out.array.dtype)

    def run() -> list[torch.Tensor]:
        comm.broadcast(whole, root)
        out.array[...] = np.split(whole, comm.world_size)[comm.rank]
        return _done([out])

    return run


def reduce_scatter(comm: Collectives, pairs: Sequence[tuple[View, View]], redop: str) -> Job:
    """``pairs``: (output block, input of ``world_size`` blocks) each."""

    def run() -> list[torch.Tensor]:
        for out, src in pairs:
            comm.reduce_scatter(src.array, out.array, redop)
        return _done([out for out, _ in pairs])

    return run


def reduce_scatter_list(comm: Communicator, out: HostView, srcs: list[HostView], redop: str) -> Job:
    """torch's list form: the input blocks are joined into one buffer first."""
    whole = np.concatenate([src.array for src in srcs])  # now: the inputs as issued

    def run() -> list[torch.Tensor]:
        comm.reduce_scatter(whole, out.array, redop)
        return _done([out])

    return run


def all_to_all(comm: Collectives, out: View, src: View) -> Job:
    def run() -> list[torch.Tensor]:
        comm.all_to_all(src.array, out.array)
        return _done([out])

    return run


def all_to_all_uneven(
    blocks: BlockExchange,
    out: HostView,
    src: HostView,
    out_counts: list[int],
    in_counts: list[int],
) -> Job:
    """``all_to_all_single`` with splits (``*_counts``: elements per rank)."""

    def run() -> list[torch.Tensor]:
        whole = (out.array.reshape(-1), src.array.reshape(-1))
        blocks.exchange(cut(whole[0], out_counts), cut(whole[1], in_counts), whole)
        return _done([out])

    return run


def all_to_all_list(blocks: BlockExchange, outs: list[HostView], srcs: list[HostView]) -> Job:
    """torch's list form, blocks of any sizes (as NCCL's, where gloo's takes equal blocks
    only)."""
    n = blocks.comm.world_size
    if len(outs) != n or len(srcs) != n:
        raise InvalidArgument(
            f"all_to_all: {len(outs)} output and {len(srcs)} input tensors; the world has "
            f"{n} ranks, one tensor each",
            op="all_to_all",
        )
    dtypes = {view.array.dtype for view in [*outs, *srcs]}
    if len(dtypes) > 1:
        raise InvalidArgument(
            f"all_to_all: the tensors must have one dtype; these have {sorted(map(str, dtypes))}",
            op="all_to_all",
        )

    def run() -> list[torch.Tensor]:
        blocks.exchange([v.array.reshape(-1) for v in outs], [v.array.reshape(-1) for v in srcs])
        return _done(outs)

    return run


def barrier(comm: Communicator) -> Job:
    def run() -> list[torch.Tensor]:
        comm.barrier()
        return []

    return run


def send(comm: Communicator, views: list[HostView], dst: int) -> Job:
    def run() -> list[torch.Tensor]:
        for view in views:
            comm.send(view.array, dst)
        return [view.tensor for view in views]

    return run


def recv(comm: Communicator, views: list[HostView], src: int) -> Job:
    def run() -> list[torch.Tensor]:
        for view in views:
            comm.recv(view.array, src)
        return _done(views)

    return run
