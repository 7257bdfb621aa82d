"""Folding rank lists into ranges (``0-5,7``) and reading them back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cclctl.errors import UsageError
from cclctl.ranges import fold_ranks, parse_ranks


@pytest.mark.parametrize(
    ("ranks", "folded"),
    [
        ([], ""),
        ([3], "3"),
        ([0, 1, 2, 3, 4, 5, 7], "0-5,7"),
        ([7, 6, 5, 2], "2,5-7"),
        ([1, 1, 0, 0], "0-1"),
        ([0, 2, 4], "0,2,4"),
        (range(1000), "0-999"),
    ],
)
def test_fold_ranks(ranks: list[int], folded: str) -> None:
    assert fold_ranks(ranks) == folded


@pytest.mark.parametrize(
    ("text", "ranks"),
    [("0-5,7", [0, 1, 2, 3, 4, 5, 7]), (" 3 , 1-2 ", [1, 2, 3]), ("", []), ("4,4", [4])],
)
def test_parse_ranks(text: str, ranks: list[int]) -> None:
    assert parse_ranks(text) == ranks


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1,x", "'x' in '1,x' is not a rank or a range like 0-3"),
        ("5-2", "'5-2' in '5-2' is not a valid rank range"),
        ("3-", "'3-' in '3-' is not a rank or a range like 0-3"),
        ("0-99999999", "'0-99999999' in '0-99999999' is not a valid rank range"),
    ],
)
def test_parse_ranks_rejects_bad_input(text: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_ranks(text)
    assert str(info.value) == message


@given(st.sets(st.integers(min_value=0, max_value=300)))
def test_parse_inverts_fold(ranks: set[int]) -> None:
    assert parse_ranks(fold_ranks(ranks)) == sorted(ranks)
