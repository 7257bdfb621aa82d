"""Message sizes: parse "8", "1K", "64M", "1G" and build the sweep as nccl-tests does.

The size column of the table is the per-rank buffer in bytes as nccl-tests counts it (for
all_gather the gathered receive buffer, for reduce_scatter the send buffer), and the count
column is the op's element count per rank, so numbers line up with all_*_perf's.
"""

from __future__ import annotations

import dataclasses
import re

from cclctl.benchmark.catalog import CHUNKED_OPS
from cclctl.errors import ConfigError

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str, flag: str = "size") -> int:
    """Bytes in ``text``: a number with an optional binary unit K, M, G or T (1K = 1024).

    Fractions are allowed when they make whole bytes ("1.5K"), as nccl-tests allows them.
    """
    match = _SIZE.match(text)
    if not match:
        raise ConfigError(
            f"{flag} {text!r} is not a size; write bytes like 8, 1K, 64M or 1G", flag=flag
        )
    number, unit = match.groups()
    value = float(number) * _UNITS[unit.lower()]
    if value != int(value):
        raise ConfigError(f"{flag} {text!r} is not a whole number of bytes", flag=flag)
    if value < 1:
        raise ConfigError(f"{flag} {text!r} must be at least 1 byte", flag=flag)
    return int(value)


def size_sweep(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    """Sizes from ``minbytes`` multiplied by ``factor`` while they stay <= ``maxbytes``."""
    if minbytes < 1:
        raise ConfigError(f"-b/--minbytes {minbytes} must be at least 1 byte", flag="--minbytes")
    if minbytes > maxbytes:
        raise ConfigError(
            f"-b/--minbytes {minbytes} is larger than -e/--maxbytes {maxbytes}",
            flag="--minbytes",
        )
    if factor < 2:
        raise ConfigError(f"-f/--stepfactor {factor} must be at least 2", flag="--stepfactor")
    sizes = []
    size = minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= factor
    return sizes


def format_bytes(nbytes: int) -> str:
    """Short human size for progress text ("64 MiB"), exact for the sweep's round sizes."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


@dataclasses.dataclass(frozen=True)
class Shape:
    """Buffer geometry of one op at one size on ``world`` ranks (element counts per rank).

    ``size`` and ``count`` are what the table shows; ``send``/``recv`` are the buffer lengths
    each rank allocates; ``chunk`` is the per-peer block of chunked ops (else ``count``).
    """

    size: int
    count: int
    send: int
    recv: int
    chunk: int


def shape_for(op: str, nbytes: int, itemsize: int, world: int) -> Shape:
    """Round ``nbytes`` down to what ``op`` needs and lay out its buffers, like nccl-tests.

    Elements first (bytes // itemsize), then, for ops that split the buffer per rank, a
    multiple of the world size; a size too small for one element per rank gives count 0.
    """
    count = nbytes // itemsize
    if op not in CHUNKED_OPS:
        return Shape(count * itemsize, count, count, count, count)
    chunk = count // world
    whole = chunk * world
    if op == "all_gather":
        return Shape(whole * itemsize, chunk, chunk, whole, chunk)
    if op == "reduce_scatter":
        return Shape(whole * itemsize, chunk, whole, chunk, chunk)
    return Shape(whole * itemsize, chunk, whole, whole, chunk)  # alltoall


def plan(op: str, sizes: list[int], itemsize: int, world: int) -> list[Shape]:
    """The shapes a sweep runs for ``op``: rounded, with empty (count 0) sizes dropped."""
    shapes = (shape_for(op, nbytes, itemsize, world) for nbytes in sizes)
    return [shape for shape in shapes if shape.count > 0]
