"""How each collective is cut into chunks that fit one staging buffer.

A :class:`Chunk` says which runs of the device input are loaded into the staging buffer
(:attr:`Chunk.loads`), where in it the host collective reads and writes, and which runs go
back to the device output (:attr:`Chunk.stores`). Whole-buffer collectives (all_reduce,
broadcast, reduce) cut the buffer into consecutive runs; the per-rank ones (all_gather,
reduce_scatter, all_to_all) cut *each rank's part* alike, so chunk ``k`` of every part
travels in one host call and each element keeps the rank block it has in the whole call.
"""

from __future__ import annotations

import dataclasses

from cclctl.errors import ConfigError


@dataclasses.dataclass(frozen=True, slots=True)
class Piece:
    """``count`` elements at ``dev`` in a device buffer and at ``host`` in a staging one."""

    dev: int
    host: int
    count: int


@dataclasses.dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk's copies and the staging regions its host collective reads and writes
    (``inp`` and ``out``: (offset, count) in elements; the same region: in place)."""

    loads: tuple[Piece, ...]
    stores: tuple[Piece, ...]
    inp: tuple[int, int]
    out: tuple[int, int]

    @property
    def used(self) -> int:
        """Elements of the staging buffer the chunk uses."""
        return max(sum(self.inp), sum(self.out))


def spans(total: int, per: int) -> list[tuple[int, int]]:
    """``(start, count)`` runs of at most ``per`` elements covering ``[0, total)``."""
    return [(s, min(per, total - s)) for s in range(0, total, per)]


def _per(elements: int, buffers: int, op: str) -> int:
    """Elements per rank part when one staging buffer of ``elements`` holds ``buffers``."""
    per = elements // buffers
    if per < 1:
        raise ConfigError(
            f"{op}: a staging buffer is too small for {buffers} parts (raise CCLCTL_STAGE_CHUNK)"
        )
    return per


def whole(count: int, elements: int, *, load: bool = True, store: bool = True) -> list[Chunk]:
    """all_reduce, broadcast, reduce: consecutive runs, reduced or sent in place
    (``load``/``store``: whether this rank copies its input in and its result out)."""
    return [
        Chunk(
            (Piece(s, 0, c),) if load else (),
            (Piece(s, 0, c),) if store else (),
            (0, c),
            (0, c),
        )
        for s, c in spans(count, elements)
    ]


def gather(part: int, n: int, elements: int) -> list[Chunk]:
    """all_gather of ``part`` elements per rank among ``n``: run ``k`` of this rank's part
    in, run ``k`` of every rank's part out."""
    out: list[Chunk] = []
    for s, m in spans(part, _per(elements, n + 1, "all_gather")):
        stores = tuple(Piece(r * part + s, m + r * m, m) for r in range(n))
        out.append(Chunk((Piece(s, 0, m),), stores, (0, m), (m, n * m)))
    return out


def scatter(part: int, n: int, elements: int) -> list[Chunk]:
    """reduce_scatter to ``part`` elements per rank among ``n``: run ``k`` of every rank's
    block in, run ``k`` of this rank's reduced block out."""
    out: list[Chunk] = []
    for s, m in spans(part, _per(elements, n + 1, "reduce_scatter")):
        loads = tuple(Piece(r * part + s, r * m, m) for r in range(n))
        out.append(Chunk(loads, (Piece(s, n * m, m),), (0, n * m), (n * m, m)))
    return out


def exchange(part: int, n: int, elements: int) -> list[Chunk]:
    """all_to_all of ``part`` elements per rank pair among ``n``: run ``k`` of every block
    in and out."""
    out: list[Chunk] = []
    for s, m in spans(part, _per(elements, 2 * n, "all_to_all")):
        loads = tuple(Piece(r * part + s, r * m, m) for r in range(n))
        stores = tuple(Piece(r * part + s, n * m + r * m, m) for r in range(n))
        out.append(Chunk(loads, stores, (0, n * m), (n * m, n * m)))
    return out
