"""The slowness signals' windows (telemetry/windows.py), on an injected clock: entries,
calls and time inside per window, calls spanning a boundary, calls still running, the
per-peer deltas, the bounds, and a status that carries them."""

from __future__ import annotations

from typing import Any

from cclctl.records import COMPLETED, CollectiveRecord, snapshot_from_json
from cclctl.slow_signals import MAX_ENTRIES, MAX_WINDOWS, sample_entries
from cclctl.telemetry import windows as windows_module
from cclctl.telemetry.recorder import Recorder
from cclctl.telemetry.windows import (
    ENTRY_RECV_WAIT,
    ENTRY_SEND_WAIT,
    RECV_WAIT,
    SEND_WAIT,
    PeerWaits,
    Windows,
)

S = 1_000_000_000
T0 = 1_733_400_000 * S  # a multiple of the window


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _rec(seq: int, start: int, end: int = 0, comm: str = "0:0-3", **kw: Any) -> CollectiveRecord:
    rec = CollectiveRecord(comm, seq, "all_reduce", start_ns=start, **kw)
    if end:
        rec.state, rec.end_ns = COMPLETED, end
    return rec


def _recorder(clock: Clock, peers: Any = None) -> Recorder:
    rec = Recorder(100)
    rec.windows = Windows(5.0, peers, clock)
    return rec


def test_a_window_holds_its_calls_time_inside_and_entries() -> None:
    clock = Clock(T0)
    recorder = _recorder(clock)
    for seq in range(1, 11):
        recorder.start(_rec(seq, T0 + seq * 100_000_000, T0 + seq * 100_000_000 + 1_000_000))
    recorder.fold()
    first = recorder.signals()
    assert first is not None and first.windows == []  # not complete
    clock.now = T0 + 5 * S
    sig = recorder.signals()
    assert sig is not None and len(sig.windows) == 1
    window = sig.windows[0]
    assert (window.start_ns, window.end_ns) == (T0, T0 + 5 * S)
    comm = window.comms["0:0-3"]
    assert (comm.calls, comm.inside_ns) == (10, 10_000_000)
    assert comm.entries == [(seq, T0 + seq * 100_000_000) for seq in range(1, 11)]


def test_entries_are_sampled_by_seq_so_ranks_keep_the_same_ones() -> None:
    kept = []
    for offset in (0, 3_000_000):  # two ranks, entering at other times
        clock = Clock(T0)
        recorder = _recorder(clock)
        for seq in range(1, 301):
            start = T0 + offset + seq * 10_000_000
            recorder.start(_rec(seq, start, start + 1000))
            if seq % 50 == 0:
                recorder.fold()
        clock.now = T0 + 5 * S
        sig = recorder.signals()
        assert sig is not None
        kept.append([seq for seq, _ in sig.windows[0].comms["0:0-3"].entries])
    assert kept[0] == kept[1] == [s for s, _ in sample_entries((s, 0) for s in range(1, 301))]
    assert len(kept[0]) <= MAX_ENTRIES


def test_a_call_across_a_boundary_is_split_and_counted_where_it_ended() -> None:
    clock = Clock(T0)
    recorder = _recorder(clock)
    recorder.start(_rec(1, T0 + 4 * S, T0 + 6 * S))
    clock.now = T0 + 10 * S
    sig = recorder.signals()
    assert sig is not None
    first, second = (w.comms["0:0-3"] for w in sig.windows)
    assert (first.calls, first.inside_ns, [s for s, _ in first.entries]) == (0, S, [1])
    assert (second.calls, second.inside_ns, second.entries) == (1, S, [])


def test_a_call_still_running_counts_up_to_each_window_that_closes() -> None:
    clock = Clock(T0)
    recorder = _recorder(clock)
    hung = _rec(1, T0 + 3 * S)
    recorder.start(hung)
    clock.now = T0 + 5 * S + 1
    recorder.fold()
    clock.now = T0 + 10 * S + 1
    sig = recorder.signals()
    assert sig is not None
    assert [w.comms["0:0-3"].inside_ns for w in sig.windows] == [2 * S, 5 * S]
    assert [w.comms["0:0-3"].calls for w in sig.windows] == [0, 0]
    hung.state, hung.end_ns = COMPLETED, T0 + 11 * S
    clock.now = T0 + 15 * S
    sig = recorder.signals()
    assert sig is not None
    assert (sig.windows[-1].comms["0:0-3"].inside_ns, sig.windows[-1].comms["0:0-3"].calls) == (
        S,
        1,
    )


def test_point_to_point_calls_count_but_leave_no_entry() -> None:
    clock = Clock(T0)
    recorder = _recorder(clock)
    recorder.start(_rec(7, T0 + S, T0 + 2 * S, peer=1))
    clock.now = T0 + 5 * S
    sig = recorder.signals()
    assert sig is not None
    comm = sig.windows[0].comms["0:0-3"]
    assert (comm.calls, comm.inside_ns, comm.entries) == (1, S, [])


def test_peers_hold_what_their_totals_grew_by_in_the_window() -> None:
    totals = {2: ("tcp", 100, 200, 1, 2, 3), 3: ("shm", 0, 0, 0, 0, 0)}
    clock = Clock(T0)
    recorder = _recorder(clock, lambda: totals)
    clock.now = T0 + 5 * S
    recorder.signals()  # a reader's fold closes the first window
    totals = {2: ("tcp", 150, 200, 1, 2, 13), 3: ("shm", 0, 0, 0, 0, 0)}
    clock.now = T0 + 10 * S
    sig = recorder.signals()
    assert sig is not None
    first, second = sig.windows
    assert first.peers[2].to_dict() == {
        "via": "tcp", "sent": 100, "received": 200,
        "send_wait_ns": 1, "recv_wait_ns": 2, "entry_wait_ns": 3,
    }  # fmt: skip
    assert 3 not in first.peers  # nothing exchanged with it
    assert (second.peers[2].sent, second.peers[2].received, second.peers[2].entry_wait_ns) == (
        50,
        0,
        10,
    )


def test_only_the_last_windows_are_kept_and_a_long_idle_skips_ahead() -> None:
    clock = Clock(T0)
    recorder = _recorder(clock)
    clock.now = T0 + 1000 * 5 * S
    sig = recorder.signals()
    assert sig is not None and len(sig.windows) == MAX_WINDOWS
    assert sig.windows[-1].end_ns == clock.now
    starts = [w.start_ns for w in sig.windows]
    assert starts == sorted(starts)


def test_records_from_a_clock_that_stepped_are_left_out() -> None:
    clock = Clock(T0 + 20 * S)
    recorder = _recorder(clock)
    recorder.start(_rec(1, T0, T0 + S))  # before the windows began
    recorder.start(_rec(2, T0 + 10_000 * S, T0 + 10_000 * S + 1))  # far ahead
    clock.now = T0 + 25 * S
    sig = recorder.signals()
    assert sig is not None and sig.windows[0].comms == {}


def test_peer_waits_add_up_per_kind() -> None:
    waits = PeerWaits()
    waits.add(3, ENTRY_RECV_WAIT, 10)
    waits.add(3, SEND_WAIT, 1)
    waits.add(3, RECV_WAIT, 2)
    waits.add(3, ENTRY_RECV_WAIT, 5)
    waits.add(3, ENTRY_SEND_WAIT, 4)
    assert waits.copy() == {3: (1, 2, 4, 15)}


def test_a_status_carries_the_signals(make_tel: Any) -> None:
    tel = make_tel(slow_window_s=0.1)
    tel.peer_waits.add(1, ENTRY_SEND_WAIT, 3)
    tel.peer_waits.add(1, ENTRY_RECV_WAIT, 4)
    tel.add_link_source(lambda: ([0, 64, 0, 0], [0, 32, 0, 0]))
    tel.add_vias({1: "shm"})
    tel.windows._next -= 3  # as if three windows had passed since it started
    snap = snapshot_from_json(tel.snapshot("status").to_json())
    assert snap.signals is not None and snap.signals.window_s == 0.1
    peers = snap.signals.windows[-1].peers
    assert peers[1].to_dict() == {
        "via": "shm", "sent": 64, "received": 32,
        "send_wait_ns": 0, "recv_wait_ns": 0, "entry_wait_ns": 7,
    }  # fmt: skip


def test_the_calls_own_folds_leave_the_records_to_a_readers_fold(monkeypatch: Any) -> None:
    clock = Clock(T0)
    recorder = _recorder(clock)
    windows = recorder.windows
    assert windows is not None
    recorder.start(_rec(1, T0 + S, T0 + 2 * S))
    recorder.fold()  # on the calls' path: kept, not added
    assert windows._open == {}
    clock.now = T0 + 5 * S
    recorder.fold()  # nor does it close a window
    assert list(windows._done) == []
    sig = recorder.signals()  # a reader's fold adds them, then closes
    assert sig is not None and sig.windows[0].comms["0:0-3"].calls == 1
    monkeypatch.setattr(windows_module, "MAX_DEFERRED", 3)
    for seq in range(2, 6):  # no reader: past the bound the calls' fold adds them itself
        recorder.start(_rec(seq, T0 + 6 * S, T0 + 6 * S + 1))
        recorder.fold()
    assert windows._open[T0 // (5 * S) + 1]["0:0-3"].calls == 4
