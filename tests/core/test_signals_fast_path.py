"""Entry lists read by the fast path (plain JSON ints) and by the checked one (anything
else) give the same entries, and every list the checked path refuses is still refused
with its message, wherever in the list the bad pair sits."""

from __future__ import annotations

import enum
from typing import Any

import pytest

from cclctl.errors import BadInput
from cclctl.slow_signals import (
    PeerWindow,
    _count,
    _entries_checked,
    _entries_from_list,
    _peer_from_dict,
)


class Seq(enum.IntEnum):
    FIRST = 7


def test_plain_pairs_read_as_the_checked_path_reads_them() -> None:
    pairs = [[1, 10], [2, 0], [0, 2**62]]
    assert _entries_from_list(pairs, "w") == _entries_checked(pairs, "w") == [
        (1, 10), (2, 0), (0, 2**62)
    ]  # fmt: skip
    assert _entries_from_list([], "w") == []


def test_an_int_subclass_is_read_as_a_plain_int() -> None:
    entries = _entries_from_list([[1, 10], [Seq.FIRST, 20]], "w")
    assert entries == [(1, 10), (7, 20)]
    assert all(type(x) is int for pair in entries for x in pair)
    assert _count({"calls": Seq.FIRST}, "calls", "w") == 7
    assert type(_count({"calls": Seq.FIRST}, "calls", "w")) is int


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ([1, True], r"must be \[seq, enter_ns\]"),
        ([1, 2.0], r"must be \[seq, enter_ns\]"),
        ((1, 2), r"must be \[seq, enter_ns\]"),
        ([1, 2, 3], r"must be \[seq, enter_ns\]"),
        ([-1, 2], "negative"),
        ([1, -2], "negative"),
    ],
)
@pytest.mark.parametrize("at", [0, 1, 2])
def test_a_bad_pair_anywhere_is_refused_with_its_message(bad: Any, match: str, at: int) -> None:
    pairs: list[Any] = [[1, 10], [2, 20]]
    pairs.insert(at, bad)
    with pytest.raises(BadInput, match=f"w: .*{match}"):
        _entries_from_list(pairs, "w")


@pytest.mark.parametrize("value", [True, -1, 1.5, None, "3"])
def test_a_count_that_is_not_a_non_negative_int_is_refused(value: object) -> None:
    with pytest.raises(BadInput, match="'calls' must be a non-negative integer"):
        _count({"calls": value}, "calls", "w")


def test_a_peer_reads_alike_on_both_paths_and_refuses_what_it_refused() -> None:
    plain = {"via": "tcp", "sent": 5, "received": 6, "recv_transfer_ns": 9}
    assert _peer_from_dict(plain, "w") == PeerWindow("tcp", 5, 6, 0, 0, 0, 9)
    odd = {**plain, "sent": Seq.FIRST}
    peer = _peer_from_dict(odd, "w")
    assert peer == PeerWindow("tcp", 7, 6, 0, 0, 0, 9) and type(peer.sent) is int
    for value in (True, -1, 2.5):
        with pytest.raises(BadInput, match="w: field 'received' must be a non-negative"):
            _peer_from_dict({**plain, "received": value}, "w")
