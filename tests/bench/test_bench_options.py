"""`cclctl bench` options: every bad value is a one-line error that names its flag."""

from __future__ import annotations

from typing import Any

import pytest

from cclctl.benchmark.options import ITER_BUDGET_BYTES, BenchOptions, build_options
from cclctl.errors import BadInput, ConfigError


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"collective": "all_reduce,bogus"}, "--collective"),
        ({"collective": " , "}, "--collective"),
        ({"minbytes": "1M", "maxbytes": "1K"}, "--minbytes"),
        ({"minbytes": "12Q"}, "-b/--minbytes"),
        ({"maxbytes": "lots"}, "-e/--maxbytes"),
        ({"stepfactor": 1}, "--stepfactor"),
        ({"dtype": "complex64"}, "--dtype"),
        ({"redop": "xor"}, "-o/--op"),
        ({"redop": "all_reduce"}, "-o/--op"),
        ({"collective": "all_gather", "redop": "max"}, "-o/--op"),
        ({"collective": "all_reduce,broadcast", "redop": "sum"}, "-o/--op"),
        ({"check": 2}, "--check"),
        ({"iters": 0}, "-n/--iters"),
        ({"warmup_iters": -1}, "-w/--warmup_iters"),
        ({"average": 4}, "-a/--average"),
        ({"average": -1}, "-a/--average"),
        ({"timeout_s": 0.0}, "-T/--timeout"),
        ({"timeout_s": -2.0}, "-T/--timeout"),
        ({"root": -1}, "--root"),
        ({"min_busbw": -3.0}, "--min-busbw"),
    ],
)
def test_bad_values_name_the_flag(kwargs: dict[str, Any], flag: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_options(**kwargs)
    assert info.value.exit_code == 2
    assert info.value.fields["flag"] in flag
    assert flag.split("/")[-1] in str(info.value)
    assert "\n" not in str(info.value)


def test_root_must_be_a_rank_of_the_job() -> None:
    opts = build_options(collective="broadcast", root=2)
    opts.check_world(3)
    with pytest.raises(ConfigError, match=r"--root 2 is out of range for 2 ranks"):
        opts.check_world(2)
    with pytest.raises(ConfigError, match="--nranks"):
        opts.check_world(0)


def test_ops_accept_aliases_and_drop_duplicates() -> None:
    opts = build_options(collective="allreduce, all_to_all,all_reduce,SENDRECV")
    assert opts.ops == ("all_reduce", "alltoall", "sendrecv")


def test_defaults_match_the_issue() -> None:
    opts = build_options()
    assert opts.ops == ("all_reduce",)
    assert (opts.minbytes, opts.maxbytes, opts.stepfactor) == (8, 64 << 20, 2)
    assert (opts.dtype, opts.redop, opts.root, opts.check) == ("float32", "sum", 0, True)
    assert build_options(dtype="half").dtype == "float16"  # nccl-tests' names work too


def test_auto_iterations_shrink_for_big_sizes_and_explicit_ones_win() -> None:
    auto = build_options()
    assert auto.iters_for(8) == 20 and auto.warmup_for(8) == 5
    assert auto.iters_for(64 << 20) == 1 and auto.warmup_for(64 << 20) == 1
    assert all(n * auto.iters_for(n) <= max(ITER_BUDGET_BYTES, n) for n in auto.sizes())
    fixed = build_options(iters=7, warmup_iters=0)
    assert fixed.iters_for(64 << 20) == 7 and fixed.warmup_for(64 << 20) == 0


def test_json_round_trip_for_the_spawned_ranks() -> None:
    opts = build_options(collective="reduce,alltoall", redop=None, dtype="bf16", min_busbw=2.5,
                         command=["cclctl", "bench"])  # fmt: skip
    assert BenchOptions.from_json(opts.to_json()) == opts


@pytest.mark.parametrize("text", ["[]", "{", '{"ops": ["all_reduce"], "surprise": 1}',
                                  '{"ops": []}', '{"minbytes": "8"}'])  # fmt: skip
def test_malformed_option_documents_are_rejected(text: str) -> None:
    with pytest.raises((BadInput, ConfigError)):
        BenchOptions.from_json(text)
