"""Exact inputs: for every op x dtype x redop, the expected value is what the collective must
produce whatever order the ranks' values are reduced in, so `--check` can use ``==``."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pytest

from cclctl.benchmark.catalog import (
    CHUNKED_OPS,
    DTYPES,
    OPS,
    REDOPS,
    REDUCING_OPS,
    resolve_dtype,
)
from cclctl.benchmark.inputs import PERIOD, Case, count_wrong, expected, make_input, tiled
from cclctl.benchmark.selftest import Corruption
from cclctl.benchmark.sizes import shape_for
from cclctl.errors import ConfigError

WORLDS = (1, 2, 3, 5)
_UFUNCS: dict[str, Callable[..., np.ndarray]] = {
    "sum": np.add,
    "avg": np.add,
    "prod": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
}


def _orders(parts: list[np.ndarray], redop: str) -> list[np.ndarray]:
    """The reduction in the data type itself, in three different association orders."""
    ufunc = _UFUNCS[redop]

    def tree(items: list[np.ndarray]) -> np.ndarray:
        if len(items) == 1:
            return items[0]
        mid = len(items) // 2
        return ufunc(tree(items[:mid]), tree(items[mid:]))

    results = [
        functools.reduce(ufunc, parts),
        functools.reduce(ufunc, parts[::-1]),
        tree(parts),
    ]
    if redop == "avg":
        n = len(parts)
        kind = parts[0].dtype.kind
        results = [(r // n if kind in "iu" else (r / n).astype(r.dtype)) for r in results]
    return results


def _reference(case: Case) -> list[list[np.ndarray | None]]:
    """What each rank must receive, by the op's definition, once per reduction order."""
    n, root, k = case.world, case.root, case.shape.chunk
    inputs = [make_input(case, r) for r in range(n)]
    op = case.op
    if op in REDUCING_OPS:
        outs = []
        for total in _orders(inputs, case.redop):
            if op == "all_reduce":
                outs.append([total] * n)
            elif op == "reduce":
                outs.append([total if r == root else None for r in range(n)])
            else:
                outs.append([total[r * k : (r + 1) * k] for r in range(n)])
        return outs
    if op == "all_gather":
        return [[np.concatenate(inputs)] * n]
    if op == "broadcast":
        return [[inputs[root]] * n]
    if op == "sendrecv":
        return [[inputs[(r - 1) % n] for r in range(n)]]
    return [[np.concatenate([inp[r * k : (r + 1) * k] for inp in inputs]) for r in range(n)]]


def _cases() -> list[tuple[str, str, str, int]]:
    cases = []
    for op in OPS:
        for redop in REDOPS if op in REDUCING_OPS else ("sum",):
            for dtype in DTYPES:
                for world in WORLDS:
                    cases.append((op, dtype, redop, world))
    return cases


@pytest.mark.parametrize(("op", "dtype", "redop", "world"), _cases())
def test_expected_is_exact_in_every_reduction_order(
    op: str, dtype: str, redop: str, world: int
) -> None:
    info = resolve_dtype(dtype)
    # Every rank's block is longer than the pattern's period, so tiling and offsets are used.
    nbytes = (PERIOD + 1000) * info.itemsize * (world if op in CHUNKED_OPS else 1)
    shape = shape_for(op, nbytes, info.itemsize, world)
    case = Case(op, info, redop, world - 1, world, shape)
    wants = [expected(case, rank) for rank in range(world)]
    for per_rank in _reference(case):
        for rank, (want, ref) in enumerate(zip(wants, per_rank, strict=True)):
            if ref is None:
                assert want is None
                continue
            assert want is not None and want.dtype == info.numpy()
            assert want.shape == ref.shape == (shape.recv,)
            assert count_wrong(want, ref) == 0, f"rank {rank}"


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("redop", REDOPS)
def test_a_collective_that_does_nothing_is_caught(dtype: str, redop: str) -> None:
    """Inputs differ between ranks and from the result, so a no-op shows many wrong elements."""
    info = resolve_dtype(dtype)
    world = 3
    case = Case("all_reduce", info, redop, 0, world, shape_for("all_reduce", 4096, 1, world))
    for rank in range(world):
        want = expected(case, rank)
        assert want is not None
        assert count_wrong(make_input(case, rank), want) > 0.1 * want.size


def test_inputs_depend_on_rank_and_index() -> None:
    info = resolve_dtype("float32")
    case = Case("all_gather", info, "sum", 0, 4, shape_for("all_gather", 4 << 10, 4, 4))
    a, b = make_input(case, 0), make_input(case, 1)
    assert count_wrong(a, b) > 0.9 * a.size
    assert len(np.unique(a)) > 0.5 * a.size


def test_tiled_wraps_around_the_period() -> None:
    base = np.arange(5)
    assert tiled(base, 3, 9).tolist() == [3, 4, 0, 1, 2, 3, 4, 0, 1]
    assert tiled(base, 12, 2).tolist() == [2, 3]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_corruption_changes_exactly_one_element(dtype: str) -> None:
    info = resolve_dtype(dtype)
    case = Case("broadcast", info, "sum", 0, 2, shape_for("broadcast", 1024, 1, 2))
    want = expected(case, 1)
    assert want is not None
    got = want.copy()
    Corruption.apply(got)
    assert count_wrong(got, want) == 1


def test_count_wrong_counts_nan_and_shape_mismatch() -> None:
    want = np.zeros(4, dtype=np.float32)
    got = want.copy()
    got[2] = np.nan
    assert count_wrong(got, want) == 1
    assert count_wrong(np.zeros(3, dtype=np.float32), want) == 4


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("", None),
        ("1", Corruption(1)),
        ("0:all_gather", Corruption(0, "all_gather")),
        ("2:alltoall:4096", Corruption(2, "alltoall", 4096)),
        ("1::64", Corruption(1, None, 64)),
    ],
)
def test_corruption_spec(text: str, parsed: Corruption | None) -> None:
    assert Corruption.parse(text) == parsed


@pytest.mark.parametrize("text", ["x", "1:bogus", "1:all_reduce:big", "1:2:3:4"])
def test_corruption_spec_errors_name_the_variable(text: str) -> None:
    with pytest.raises(ConfigError, match="CCLCTL_BENCH_CORRUPT"):
        Corruption.parse(text)


def test_corruption_applies_only_where_asked() -> None:
    spec = Corruption(1, "all_gather", 64)
    assert spec.applies(1, "all_gather", 64)
    assert not spec.applies(0, "all_gather", 64)
    assert not spec.applies(1, "all_reduce", 64)
    assert not spec.applies(1, "all_gather", 128)
