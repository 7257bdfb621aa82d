"""Checks on the arrays handed to collectives: wrong input is a clear error, never garbage."""

from __future__ import annotations

import operator

import numpy as np

from cclctl.errors import InvalidArgument
from cclctl.runtime.transport.wire import DTYPE_NAMES

SUPPORTED_DTYPES = frozenset(name for name in DTYPE_NAMES if name)
REDUCE_OPS = ("sum", "prod", "min", "max", "avg")
_NAMES: dict[np.dtype, str] = {}  # dtype -> name, for the supported dtypes only


def dtype_name(dtype: np.dtype) -> str:
    """``dtype.name``, cached: numpy computes it in Python, and every call asks twice."""
    name = _NAMES.get(dtype)
    if name is None:
        name = dtype.name
        if name in SUPPORTED_DTYPES:
            _NAMES[dtype] = name
    return name


def flat(arr: object, what: str, op: str, *, writable: bool = False) -> np.ndarray:
    """Return a flat view of a C-contiguous numpy array of a supported dtype, or raise."""
    if not isinstance(arr, np.ndarray):
        raise InvalidArgument(
            f"{op}: {what} must be a numpy array, got {type(arr).__name__}", op=op
        )
    if dtype_name(arr.dtype) not in SUPPORTED_DTYPES:
        raise InvalidArgument(
            f"{op}: {what} has dtype {arr.dtype.name}, which cclctl does not reduce or send; "
            f"use one of {', '.join(sorted(SUPPORTED_DTYPES))}",
            op=op,
        )
    if not arr.flags.c_contiguous:
        raise InvalidArgument(
            f"{op}: {what} is not contiguous in memory; pass np.ascontiguousarray(x) "
            "(cclctl never silently copies a strided view)",
            op=op,
        )
    if writable and not arr.flags.writeable:
        raise InvalidArgument(f"{op}: {what} is read-only", op=op)
    return arr.reshape(-1)


def matching_out(out: object, like: np.ndarray, count: int, op: str) -> np.ndarray:
    """Check an output buffer: same dtype as the input and exactly ``count`` elements."""
    arr = flat(out, "out", op, writable=True)
    if arr.dtype != like.dtype:
        raise InvalidArgument(
            f"{op}: out has dtype {arr.dtype.name} but the input is {like.dtype.name}", op=op
        )
    if arr.size != count:
        raise InvalidArgument(
            f"{op}: out has {arr.size} elements, expected {count}", op=op, count=arr.size
        )
    return arr


def check_redop(redop: str, op: str) -> str:
    if redop not in REDUCE_OPS:
        raise InvalidArgument(
            f"{op}: unknown reduction {redop!r}; use one of {', '.join(REDUCE_OPS)}", op=op
        )
    return redop


def same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return a.size > 0 and a.ctypes.data == b.ctypes.data and a.nbytes == b.nbytes


def is_slot(part: np.ndarray, whole: np.ndarray, index: int) -> bool:
    """True when ``part`` is exactly the ``index``-th block of ``whole`` (an in-place call)."""
    return (
        part.size > 0
        and part.ctypes.data == whole.ctypes.data + index * part.nbytes
        and whole.nbytes >= (index + 1) * part.nbytes
    )


def overlaps(a: np.ndarray, b: np.ndarray) -> bool:
    return a.size > 0 and b.size > 0 and bool(np.shares_memory(a, b))


def check_peer(peer: int, rank: int, world_size: int, op: str) -> int:
    if not isinstance(peer, int | np.integer) or not 0 <= peer < world_size:
        raise InvalidArgument(
            f"{op}: peer {peer} is not a rank of this communicator (0..{world_size - 1})",
            op=op,
        )
    if peer == rank:
        raise InvalidArgument(f"{op}: rank {peer} cannot {op} to itself", op=op)
    return int(peer)


def check_root(root: int, world_size: int, op: str) -> int:
    if not isinstance(root, int | np.integer) or not 0 <= root < world_size:
        raise InvalidArgument(
            f"{op}: root {root} is not a rank of this communicator (0..{world_size - 1})",
            op=op,
            root=root,
        )
    return int(root)


def in_out(buf: object, out: object, op: str, *, writable: bool) -> tuple[np.ndarray, np.ndarray]:
    """Flat views of an in-or-out-of-place call's input and output (the input itself when
    ``out`` is None); ``writable``: the input is written (in place, or on the root)."""
    src = flat(buf, "buf", op, writable=writable)
    return src, src if out is None else matching_out(out, src, src.size, op)


def reduce_args(buf: object, out: object, op: str) -> tuple[np.ndarray, np.ndarray]:
    """all_reduce's views: ``out`` may be ``buf`` itself, but not overlap it partly."""
    src, dst = in_out(buf, out, op, writable=out is None)
    if dst is not src and not same_memory(src, dst) and overlaps(src, dst):
        raise InvalidArgument(f"{op}: out partially overlaps buf", op=op)
    return src, dst


def gather_args(buf: object, out: object, n: int, rank: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """all_gather's views and whether ``buf`` is already this rank's slot of ``out``."""
    src = flat(buf, "buf", "all_gather")
    dst = matching_out(out, src, src.size * n, "all_gather")
    in_slot = is_slot(src, dst, rank)
    if not in_slot and overlaps(src, dst):
        raise InvalidArgument(
            "all_gather: buf overlaps out but is not this rank's slot of it", op="all_gather"
        )
    return src, dst, in_slot


def scatter_args(buf: object, out: object, n: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """reduce_scatter's views: ``buf`` splits evenly into ``n`` blocks, ``out`` holds one
    (it may be this rank's block of ``buf``)."""
    src = flat(buf, "buf", "reduce_scatter")
    if src.size % n:
        raise InvalidArgument(
            f"reduce_scatter: buf has {src.size} elements, not a multiple of the world size {n}",
            op="reduce_scatter",
        )
    dst = matching_out(out, src, src.size // n, "reduce_scatter")
    if overlaps(src, dst) and not is_slot(dst, src, rank):
        raise InvalidArgument(
            "reduce_scatter: out overlaps buf but is not this rank's slot of it",
            op="reduce_scatter",
        )
    return src, dst


def all_to_all_args(buf: object, out: object, n: int) -> tuple[np.ndarray, np.ndarray]:
    """all_to_all's views: ``buf`` splits into ``n`` equal blocks, ``out`` matches it."""
    src = flat(buf, "buf", "all_to_all")
    if src.size % n:
        raise InvalidArgument(
            f"all_to_all: buf has {src.size} elements, not a multiple of the world size {n}",
            op="all_to_all",
        )
    return src, matching_out(out, src, src.size, "all_to_all")


def all_to_allv_args(
    buf: object, out: object, send_counts: object, recv_counts: object, n: int, rank: int
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]], list[tuple[int, int]]]:
    """all_to_allv's views and each rank's block of them (:func:`block_bounds`), this
    rank's own as large in both."""
    op = "all_to_allv"
    src = flat(buf, "buf", op)
    dst = flat(out, "out", op, writable=True)
    if dst.dtype != src.dtype:
        raise InvalidArgument(
            f"{op}: out has dtype {dst.dtype.name} but the input is {src.dtype.name}", op=op
        )
    sends = block_bounds(send_counts, n, src.size, "send_counts", op)
    recvs = block_bounds(recv_counts, n, dst.size, "recv_counts", op)
    (a, b), (c, d) = sends[rank], recvs[rank]
    if b - a != d - c:
        raise InvalidArgument(
            f"{op}: rank {rank} sends itself {b - a} elements but expects {d - c}", op=op
        )
    return src, dst, sends, recvs


def block_bounds(counts: object, n: int, total: int, what: str, op: str) -> list[tuple[int, int]]:
    """``(start, stop)`` of each rank's block: ``counts`` (``n`` non-negative element counts,
    one per rank, in rank order) laid end to end over a buffer of ``total`` elements."""
    try:
        values = [operator.index(c) for c in counts]  # type: ignore[attr-defined]
    except TypeError:
        raise InvalidArgument(
            f"{op}: {what} must be a sequence of {n} integers, one per rank, got {counts!r:.60}",
            op=op,
        ) from None
    if len(values) != n:
        raise InvalidArgument(
            f"{op}: {what} has {len(values)} counts; the world has {n} ranks", op=op
        )
    if any(v < 0 for v in values):
        raise InvalidArgument(f"{op}: {what} {values} has a negative count", op=op)
    if sum(values) != total:
        raise InvalidArgument(
            f"{op}: {what} sum to {sum(values)} elements, but the buffer has {total}",
            op=op,
            count=total,
        )
    bounds, start = [], 0
    for v in values:
        bounds.append((start, start + v))
        start += v
    return bounds
