"""Buffers and calls for each benchmarked op, out-of-place and in-place, on one rank.

In-place follows nccl-tests: the send buffer is the receive buffer's own slot (all_gather,
reduce_scatter) or the same buffer (the rest). In-place sendrecv is timed but not checked,
as in nccl-tests, because sending and receiving through one buffer has no defined result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import numpy as np

from cclctl.benchmark.inputs import Case, make_input

Array = np.ndarray


class Communicator(Protocol):
    """The part of :class:`cclctl.runtime.comm.communicator.Communicator` the benchmark drives."""

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    def all_reduce(self, buf: Array, op: str = ..., out: Array | None = ...) -> Array: ...
    def all_gather(self, buf: Array, out: Array) -> Array: ...
    def reduce_scatter(self, buf: Array, out: Array, op: str = ...) -> Array: ...
    def broadcast(self, buf: Array, root: int = ..., out: Array | None = ...) -> Array: ...
    def reduce(
        self, buf: Array, op: str = ..., root: int = ..., out: Array | None = ...
    ) -> Array: ...
    def all_to_all(self, buf: Array, out: Array) -> Array: ...
    def send(self, buf: Array, dst: int) -> object: ...
    def recv(self, buf: Array, src: int) -> object: ...
    def barrier(self) -> object: ...
    def close(self) -> object: ...


@dataclasses.dataclass
class Placement:
    """A ready-to-run op: ``run`` calls it once; ``reset`` restores the inputs and clears
    the output (so a call that writes nothing cannot pass the check); ``result`` is the
    region to compare with the expected value, or None when this placement is not checked."""

    run: Callable[[], object]
    reset: Callable[[], None]
    result: np.ndarray | None


def _slot(buf: np.ndarray, rank: int, chunk: int) -> np.ndarray:
    return buf[rank * chunk : (rank + 1) * chunk]


#: Allocates a zeroed buffer of (count, dtype).
Alloc = Callable[[int, np.dtype], Array]


def zeros(count: int, dtype: np.dtype) -> Array:
    return np.zeros(count, dtype=dtype)


def bind(comm: Communicator, case: Case, in_place: bool, alloc: Alloc = zeros) -> Placement:
    """Allocate ``case``'s buffers on this rank (with ``alloc``) and return how to run and
    check it."""
    rank, shape, op = comm.rank, case.shape, case.op
    data = make_input(case, rank)
    redop, root = case.redop, case.root

    def copy_of(arr: Array) -> Array:
        out = alloc(arr.size, arr.dtype)
        out[...] = arr
        return out

    if in_place:
        if op == "all_gather":
            buf = alloc(shape.recv, data.dtype)
            send = _slot(buf, rank, shape.chunk)
        else:
            buf = send = copy_of(data)
        result = _slot(buf, rank, shape.chunk) if op == "reduce_scatter" else buf

        def reset() -> None:
            buf[...] = 0
            send[...] = data

        calls: dict[str, Callable[[], object]] = {
            "all_reduce": lambda: comm.all_reduce(buf, op=redop),
            "all_gather": lambda: comm.all_gather(send, buf),
            "reduce_scatter": lambda: comm.reduce_scatter(buf, result, op=redop),
            "broadcast": lambda: comm.broadcast(buf, root=root),
            "reduce": lambda: comm.reduce(buf, op=redop, root=root),
            "alltoall": lambda: comm.all_to_all(buf, buf),
            "sendrecv": lambda: _sendrecv(comm, buf, buf),
        }
        checked = op != "sendrecv"
    else:
        send = copy_of(data)
        result = buf = alloc(shape.recv, data.dtype)

        def reset() -> None:
            buf[...] = 0
            send[...] = data

        calls = {
            "all_reduce": lambda: comm.all_reduce(send, op=redop, out=buf),
            "all_gather": lambda: comm.all_gather(send, buf),
            "reduce_scatter": lambda: comm.reduce_scatter(send, buf, op=redop),
            "broadcast": lambda: comm.broadcast(send, root=root, out=buf),
            "reduce": lambda: comm.reduce(send, op=redop, root=root, out=buf),
            "alltoall": lambda: comm.all_to_all(send, buf),
            "sendrecv": lambda: _sendrecv(comm, send, buf),
        }
        checked = True
    return Placement(calls[op], reset, result if checked else None)


def _sendrecv(comm: Communicator, send: np.ndarray, recv: np.ndarray) -> None:
    """Ring exchange: send to rank+1, receive from rank-1 (nccl-tests' sendrecv_perf).

    Even ranks send first and odd ranks receive first, so blocking sends cannot deadlock
    whatever the message size; one rank alone talks to itself through a copy.
    """
    n, rank = comm.world_size, comm.rank
    if n == 1:
        recv[...] = send
        return
    dst, src = (rank + 1) % n, (rank - 1) % n
    if rank % 2 == 0:
        comm.send(send, dst)
        comm.recv(recv, src)
    else:
        comm.recv(recv, src)
        comm.send(send, dst)
