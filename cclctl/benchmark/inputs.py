"""Exact inputs and expected results, so `--check` can compare every element with ``==``.

As in nccl-tests, each rank fills its buffer with small integers that depend on the rank and
the element's index, chosen per data type and reduction so that every partial result of
any reduction order is exactly representable (sums stay under 2048 in float16, under 256
in bfloat16; products are powers of two; averages divide exactly). The expected value is
computed in int64 and is therefore exact: a single flipped bit anywhere is a wrong element.

Values repeat with a prime period (65521) in the index, so a block that lands at a wrong
offset (an off-by-one-chunk bug) almost never matches by accident, while expected results
cost one period of work per rank instead of one pass over the whole buffer per rank.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cclctl.benchmark.catalog import REDUCING_OPS, DType
from cclctl.benchmark.sizes import Shape

PERIOD = 65521
_CAP = 1 << 30  # keeps generator arithmetic inside int64 for every dtype
_U64 = np.uint64


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmark row's collective: what runs, on what data, over how many ranks."""

    op: str
    dtype: DType
    redop: str  # ignored unless op reduces
    root: int
    world: int
    shape: Shape

    @property
    def kind(self) -> str:
        """The value pattern: the reduction op for reducing collectives, else "copy"."""
        return self.redop if self.op in REDUCING_OPS else "copy"


def _mix(salt: int, rank: int) -> np.ndarray:
    """A well-spread uint64 hash of (salt, rank, index) for every index of one period."""
    h = np.arange(PERIOD, dtype=_U64) * _U64(0x9E3779B97F4A7C15)
    h += _U64((salt * 0xD1B54A32D192ED03 + (rank + 1) * 0xBF58476D1CE4E5B9) % (1 << 64))
    h ^= h >> _U64(31)
    h *= _U64(0x94D049BB133111EB)
    h ^= h >> _U64(29)
    return h


def _spread(h: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Map hashes onto the integers lo..hi (inclusive) as int64."""
    return (h % _U64(hi - lo + 1)).astype(np.int64) + lo


class Pattern:
    """Per-rank integer values for one (kind, dtype, world) and their exact reduction."""

    def __init__(self, kind: str, dtype: DType, world: int) -> None:
        self.kind = kind
        self.dtype = dtype
        self.world = world

    def _range(self, bound: int) -> tuple[int, int]:
        bound = min(bound, _CAP)
        return (-bound if self.dtype.signed else 0), bound

    def values(self, rank: int) -> np.ndarray:
        """Rank ``rank``'s values for one period, as int64."""
        n, kind = self.world, self.kind
        if kind == "sum":
            return _spread(_mix(1, rank), *self._range(self.dtype.exact // n))
        if kind == "prod":
            return self._prod_factors(rank)
        if kind == "avg":
            mean, bound = self._avg_parts()
            here = _spread(_mix(4, rank % n), 0, bound)
            there = _spread(_mix(4, (rank + 1) % n), 0, bound)
            return mean + here - there  # the differences telescope to 0 over all ranks
        return _spread(_mix(2, rank), *self._range(self.dtype.exact))  # min, max, copy

    def _avg_parts(self) -> tuple[np.ndarray, int]:
        """The mean a(j) and the spread bound: |a| + 2*spread stays exact after n terms."""
        bound = min(self.dtype.exact // (3 * self.world), _CAP)
        lo, hi = (-bound, bound) if self.dtype.signed else (bound, 2 * bound)
        return _spread(_mix(3, 0), lo, hi), bound

    def _prod_factors(self, rank: int) -> np.ndarray:
        """Factors of 1 or 2 (and a sign when signed): element j gets a 2 from t(j)
        consecutive ranks, t(j) <= log2(exact), so every partial product is exact."""
        n = self.world
        twos = min(self.dtype.exact.bit_length() - 1, n)
        start = _spread(_mix(5, 0), 0, n - 1)
        taken = _spread(_mix(6, 0), 0, twos)
        values = np.where((rank - start) % n < taken, 2, 1).astype(np.int64)
        if self.dtype.signed:
            values *= np.where((_mix(7, rank) & _U64(1)).astype(bool), -1, 1)
        return values

    def reduced(self) -> np.ndarray:
        """The exact reduction of all ranks' values for one period, as int64."""
        if self.kind == "avg":
            return self._avg_parts()[0]
        ranks = [self.values(r) for r in range(self.world)]
        if self.kind == "sum":
            return np.sum(ranks, axis=0)
        if self.kind == "prod":
            return np.prod(ranks, axis=0)
        if self.kind == "min":
            return np.min(ranks, axis=0)
        if self.kind == "max":
            return np.max(ranks, axis=0)
        raise ValueError(f"pattern {self.kind!r} has no reduction")


def _cast(values: np.ndarray, dtype: DType) -> np.ndarray:
    target = dtype.numpy()
    if target.kind == "V" or target.kind == "f":  # floats (ml_dtypes' bfloat16 is kind "V")
        return values.astype(np.float64).astype(target)
    return values.astype(target)


def tiled(base: np.ndarray, start: int, count: int) -> np.ndarray:
    """Elements start..start+count of ``base`` repeated forever (a contiguous array)."""
    start %= base.size
    reps = -(-(start + count) // base.size)
    return np.tile(base, reps)[start : start + count]


def make_input(case: Case, rank: int) -> np.ndarray:
    """The send buffer rank ``rank`` starts with (``case.shape.send`` elements)."""
    base = _cast(Pattern(case.kind, case.dtype, case.world).values(rank), case.dtype)
    return tiled(base, 0, case.shape.send)


def expected(case: Case, rank: int) -> np.ndarray | None:
    """What rank ``rank``'s receive buffer must hold afterwards; None: nothing to check."""
    op, n, shape = case.op, case.world, case.shape
    pattern = Pattern(case.kind, case.dtype, n)

    def of_rank(r: int, start: int, count: int) -> np.ndarray:
        return tiled(_cast(pattern.values(r), case.dtype), start, count)

    if op == "reduce" and rank != case.root:
        return None
    if op in ("all_reduce", "reduce", "reduce_scatter"):
        start = rank * shape.chunk if op == "reduce_scatter" else 0
        return tiled(_cast(pattern.reduced(), case.dtype), start, shape.recv)
    if op == "broadcast":
        return of_rank(case.root, 0, shape.recv)
    if op == "sendrecv":
        return of_rank((rank - 1) % n, 0, shape.recv)
    offset = rank * shape.chunk if op == "alltoall" else 0  # all_gather: whole send buffers
    return np.concatenate([of_rank(peer, offset, shape.chunk) for peer in range(n)])


def count_wrong(got: np.ndarray, want: np.ndarray) -> int:
    """Elements of ``got`` that differ from ``want`` (NaN counts as wrong)."""
    if got.shape != want.shape:
        return int(max(got.size, want.size))
    return int(np.count_nonzero(got != want))
