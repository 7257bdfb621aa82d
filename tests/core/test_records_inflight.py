"""A status's call in flight, written both as ``inflight`` and as the last of its
``records``, reads as it did when each was validated on its own: the same record (a copy,
not the same object), and the same refusal when the two differ only in a type."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cclctl import records_inflight
from cclctl.errors import BadInput
from cclctl.records import CollectiveRecord, RankSnapshot, record_from_dict, snapshot_from_dict

CALL = CollectiveRecord(
    "0:0-3", 7, "all_reduce", "float32", 4, 16, algo="ring", start_ns=5, waiting_on=2,
    waiting_for="recv", stages={"d2h": 3},
)  # fmt: skip


def _doc() -> dict[str, Any]:
    snap = RankSnapshot("status", "j", 1, 4, "h", 10, 20, records=[CALL], inflight=CALL)
    return snap.to_dict()


def test_the_call_in_flight_and_the_last_record_read_alike_and_apart() -> None:
    snap = snapshot_from_dict(_doc())
    assert snap.inflight == snap.records[-1] == CALL
    assert snap.inflight is not snap.records[-1]


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [("seq", 7.0, "'seq' must be an integer"), ("root", True, "'root' must be an integer"),
     ("waiting_on", 2.0, "'waiting_on' must be an integer")],
)  # fmt: skip
def test_an_inflight_equal_in_python_but_of_another_type_is_still_refused(
    field: str, value: object, match: str
) -> None:
    doc = _doc()
    doc["inflight"][field] = value
    if field == "root":
        doc["records"][-1]["root"] = 1  # True == 1 in Python
    with pytest.raises(BadInput, match=f"d: inflight: field {match}"):
        snapshot_from_dict(doc, "d")


def test_an_inflight_other_than_the_last_record_is_read_on_its_own() -> None:
    doc = _doc()
    doc["inflight"]["seq"] = 8
    snap = snapshot_from_dict(doc)
    assert snap.inflight == record_from_dict(doc["inflight"])
    assert snap.inflight is not None and snap.inflight.seq == 8
    bad = copy.deepcopy(doc)
    bad["inflight"]["state"] = "lost"
    with pytest.raises(BadInput, match="inflight: unknown state"):
        snapshot_from_dict(bad)


@pytest.mark.parametrize(
    ("a", "b", "alike"),
    [({"a": [1, {"b": "x"}]}, {"a": [1, {"b": "x"}]}, True), ({"a": 1}, {"a": 1.0}, False),
     ({"a": 1}, {"a": True}, False), ([1, 2], [1, 2, 3], False), ({"a": 1}, {"b": 1}, False),
     ({"a": [0.0]}, {"a": [False]}, False), (None, None, True), ("x", "x", True)],
)  # fmt: skip
def test_same_is_equality_of_json_types_too(a: object, b: object, alike: bool) -> None:
    assert records_inflight.same(a, b) is alike
    assert records_inflight.same(b, a) is alike
