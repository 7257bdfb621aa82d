"""Size strings, the size sweep and per-op rounding (nccl-tests' semantics)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cclctl.benchmark.catalog import CHUNKED_OPS, OPS
from cclctl.benchmark.sizes import format_bytes, parse_size, plan, shape_for, size_sweep
from cclctl.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", 8),
        ("1K", 1024),
        ("1k", 1024),
        ("64M", 64 << 20),
        ("1G", 1 << 30),
        ("1.5K", 1536),
        ("2MiB", 2 << 20),
        ("4kb", 4096),
        (" 16 ", 16),
    ],
)
def test_parse_size_accepts_nccl_tests_spellings(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["12Q", "", "K", "-8", "1.3", "0", "8 M B", "0x10", "1e3"])
def test_parse_size_rejects_with_the_flag_named(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(text, "-b/--minbytes")
    assert str(info.value).startswith("-b/--minbytes ")
    assert "\n" not in str(info.value)


@given(st.integers(min_value=1, max_value=1 << 40), st.sampled_from(["", "K", "M", "G"]))
def test_parse_size_round_trips_integers_with_units(number: int, unit: str) -> None:
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit]
    assert parse_size(f"{number}{unit}") == number * scale


def test_default_sweep_is_8_bytes_to_64_mib_doubling() -> None:
    sizes = size_sweep(8, 64 << 20, 2)
    assert sizes[0] == 8 and sizes[-1] == 64 << 20
    assert len(sizes) == 24


@given(
    st.integers(min_value=1, max_value=1 << 30),
    st.integers(min_value=0, max_value=1 << 30),
    st.integers(min_value=2, max_value=16),
)
def test_sweep_is_geometric_and_within_bounds(lo: int, extra: int, factor: int) -> None:
    hi = lo + extra
    sizes = size_sweep(lo, hi, factor)
    assert sizes[0] == lo
    assert all(b == a * factor for a, b in itertools.pairwise(sizes))
    assert sizes[-1] <= hi < sizes[-1] * factor


@pytest.mark.parametrize(
    ("lo", "hi", "factor", "flag"),
    [(64, 8, 2, "--minbytes"), (8, 64, 1, "--stepfactor"), (0, 8, 2, "--minbytes")],
)
def test_sweep_rejects_bad_bounds(lo: int, hi: int, factor: int, flag: str) -> None:
    with pytest.raises(ConfigError) as info:
        size_sweep(lo, hi, factor)
    assert info.value.fields["flag"] == flag
    assert flag in str(info.value)


@given(
    st.sampled_from(OPS),
    st.integers(min_value=1, max_value=1 << 28),
    st.sampled_from([1, 2, 4, 8]),
    st.integers(min_value=1, max_value=64),
)
def test_shapes_round_down_to_what_the_op_needs(
    op: str, nbytes: int, itemsize: int, world: int
) -> None:
    shape = shape_for(op, nbytes, itemsize, world)
    unit = itemsize * (world if op in CHUNKED_OPS else 1)
    assert shape.size <= nbytes < shape.size + unit  # rounded down, by less than one unit
    assert shape.size % unit == 0
    if op == "all_gather":  # count: per-rank send count; size: the gathered receive buffer
        assert (shape.send, shape.recv) == (shape.count, shape.count * world)
        assert shape.size == shape.recv * itemsize
    elif op == "reduce_scatter":  # size: the send buffer; count: per-rank receive count
        assert (shape.send, shape.recv) == (shape.count * world, shape.count)
        assert shape.size == shape.send * itemsize
    elif op == "alltoall":
        assert shape.send == shape.recv == shape.count * world == shape.chunk * world
    else:
        assert shape.send == shape.recv == shape.count == shape.size // itemsize


def test_nccl_tests_example_rows() -> None:
    # all_gather_perf on 8 ranks prints "8388608  262144  float" for a 8 MiB sweep point.
    shape = shape_for("all_gather", 8 << 20, 4, 8)
    assert (shape.size, shape.count) == (8388608, 262144)
    # Not a multiple of world x itemsize: 100 B of float on 3 ranks is 96 B, 8 per rank.
    shape = shape_for("reduce_scatter", 100, 4, 3)
    assert (shape.size, shape.count, shape.send) == (96, 8, 24)


def test_plan_drops_sizes_too_small_for_one_element_per_rank() -> None:
    shapes = plan("all_gather", [8, 16, 32, 64], 4, 3)
    assert [s.size for s in shapes] == [12, 24, 60]
    assert [s.size for s in plan("all_reduce", [1, 2, 4], 4, 3)] == [4]


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (8, 1024, 3 << 20, 1 << 30, 1500)] == [
        "8 B",
        "1 KiB",
        "3 MiB",
        "1 GiB",
        "1500 B",
    ]
