"""The ``signals`` field: round trips, the bounds on every size, malformed input refused."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from cclctl import limits, slow_signals
from cclctl.errors import BadInput
from cclctl.records import RankSnapshot, snapshot_from_dict, snapshot_from_json
from cclctl.slow_signals import CommWindow, PeerWindow, Signals, Window, sample_entries

SECOND = 1_000_000_000


def _signals() -> Signals:
    first = Window(
        start_ns=1_733_400_000 * SECOND,
        end_ns=1_733_400_005 * SECOND,
        comms={
            "0:0-3": CommWindow(calls=812, inside_ns=1_234_567, entries=[(1024, 17), (1088, 99)])
        },
        peers={2: PeerWindow("shm", 4_194_304, 4_194_304, 1_000, 250_000, 3_000_000)},
    )
    second = Window(start_ns=first.end_ns, end_ns=first.end_ns + 5 * SECOND)
    return Signals(5.0, [first, second])


def _doc() -> dict[str, Any]:
    return _signals().to_dict()


def _status(sig: Signals | None) -> RankSnapshot:
    return RankSnapshot("status", "j", 1, 4, "h", 10, 5, signals=sig)


def test_signals_round_trip_through_json() -> None:
    text = json.dumps(_doc())
    assert slow_signals.signals_from_dict(json.loads(text)) == _signals()
    assert Signals.from_dict(json.loads(text)) == _signals()


def test_the_document_matches_the_contract_shape() -> None:
    doc = _doc()
    assert doc["window_s"] == 5.0
    window = doc["windows"][0]
    assert window["comms"]["0:0-3"]["entries"] == [[1024, 17], [1088, 99]]
    assert window["peers"]["2"] == {
        "via": "shm", "sent": 4_194_304, "received": 4_194_304,
        "send_wait_ns": 1_000, "recv_wait_ns": 250_000, "entry_wait_ns": 3_000_000,
    }  # fmt: skip


def test_a_snapshot_writes_signals_only_when_set_and_reads_them_back() -> None:
    assert "signals" not in _status(None).to_dict()
    snap = snapshot_from_json(_status(_signals()).to_json())
    assert snap.signals == _signals()
    assert snapshot_from_json(_status(None).to_json()).signals is None


def test_an_older_document_without_signals_still_reads() -> None:
    doc = _status(None).to_dict()
    doc.pop("signals", None)
    assert snapshot_from_dict(doc).signals is None


def test_a_document_with_bad_signals_is_bad_input_naming_the_field() -> None:
    doc = _status(None).to_dict()
    doc["signals"] = {"window_s": 5, "windows": "all"}
    with pytest.raises(BadInput, match=r"status\.json: signals: field .windows. must be a list"):
        snapshot_from_dict(doc, "status.json")


def _mutated(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(_doc())
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


W0 = ("windows", 0)


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        (("window_s",), 0, "window_s"),
        (("window_s",), float("nan"), "window_s"),
        (("window_s",), True, "window_s"),
        (("window_s",), 1e9, "window_s"),
        (("windows",), {}, "must be a list"),
        (("windows", 0), [], "expected an object"),
        ((*W0, "start_ns"), "now", "start_ns"),
        ((*W0, "end_ns"), 1, "start_ns < end_ns"),
        ((*W0, "comms"), [], "must be objects"),
        ((*W0, "peers"), 3, "must be objects"),
        ((*W0, "comms", "0:0-3", "calls"), -1, "'calls' must be a non-negative integer"),
        ((*W0, "comms", "0:0-3", "inside_ns"), 1.5, "'inside_ns'"),
        ((*W0, "comms", "0:0-3", "entries"), {}, "'entries' must be a list"),
        ((*W0, "comms", "0:0-3", "entries"), [[1]], "must be \\[seq, enter_ns\\]"),
        ((*W0, "comms", "0:0-3", "entries"), [[1, "x"]], "must be \\[seq, enter_ns\\]"),
        ((*W0, "comms", "0:0-3", "entries"), [[1, -5]], "negative"),
        ((*W0, "comms", "0:0-3"), 7, "expected an object"),
        ((*W0, "comms", ""), {}, "communicator id"),
        ((*W0, "comms", "x" * 2000), {}, "communicator id"),
        ((*W0, "peers", "two"), {"via": "tcp"}, "a peer must be a job rank"),
        ((*W0, "peers", "-1"), {"via": "tcp"}, "a peer must be a job rank"),
        ((*W0, "peers", "2", "via"), "ib", "'via' must be one of shm, tcp"),
        ((*W0, "peers", "2", "sent"), None, "'sent'"),
        ((*W0, "peers", "2", "entry_wait_ns"), -3, "'entry_wait_ns'"),
        ((*W0, "peers", "2"), "fast", "expected an object"),
        (("windows", 1, "start_ns"), 1_733_400_000 * SECOND + 1, "oldest first"),
    ],
)
def test_malformed_signals_are_bad_input(path: tuple[Any, ...], value: Any, match: str) -> None:
    with pytest.raises(BadInput, match=match):
        slow_signals.signals_from_dict(_mutated(path, value))


def test_not_an_object_is_bad_input() -> None:
    with pytest.raises(BadInput, match="expected an object, got list"):
        slow_signals.signals_from_dict([])


def _window(i: int, **fields: Any) -> dict[str, Any]:
    return {"start_ns": i * 10 + 1, "end_ns": i * 10 + 5, **fields}


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"windows": [_window(i) for i in range(slow_signals.MAX_WINDOWS + 1)]}, "13 windows"),
        (
            {
                "windows": [
                    _window(0, comms={f"{i}:0-1": {} for i in range(slow_signals.MAX_COMMS + 1)})
                ]
            },
            "33 communicators",
        ),
        (
            {"windows": [_window(0, peers={str(i): {"via": "tcp"} for i in range(4097)})]},
            "4,097 peers",
        ),
        (
            {"windows": [_window(0, comms={"0:0-1": {"entries": [[i, i] for i in range(65)]}})]},
            "65 entries",
        ),
        (
            {"windows": [_window(0, peers={str(limits.MAX_WORLD_SIZE): {"via": "tcp"}})]},
            "peer 131,072",
        ),
    ],
)
def test_sizes_beyond_the_bounds_are_too_large(doc: dict[str, Any], match: str) -> None:
    with pytest.raises(limits.TooLarge, match=match):
        slow_signals.signals_from_dict(doc)


def test_documents_at_the_bounds_are_read() -> None:
    doc = {
        "windows": [
            _window(
                i,
                comms={f"{c}:0-1": {"entries": [[s, s] for s in range(64)]} for c in range(32)},
                peers={str(p): {"via": "tcp"} for p in range(8)},
            )
            for i in range(slow_signals.MAX_WINDOWS)
        ]
    }
    parsed = slow_signals.signals_from_dict(doc)
    assert len(parsed.windows) == 12 and len(parsed.windows[0].comms) == 32
    assert parsed.window_s == slow_signals.DEFAULT_WINDOW_S


def test_sampling_keeps_the_same_seqs_whatever_the_times() -> None:
    one = sample_entries((seq, 1000 + seq) for seq in range(1, 201))
    other = sample_entries((seq, 5 * seq) for seq in range(1, 201))
    assert [s for s, _ in one] == [s for s, _ in other]
    assert len(one) <= slow_signals.MAX_ENTRIES
    assert len(one) > slow_signals.MAX_ENTRIES // 4  # thinned no further than it had to be


def test_sampling_keeps_everything_that_fits() -> None:
    entries = [(seq, seq) for seq in range(7, 71)]
    assert sample_entries(reversed(entries)) == entries
