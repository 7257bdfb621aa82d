"""Which calls' entry times the signals keep: seqs chosen by a fixed hash, so every rank
keeps the same ones and every call position of a training step is sampled alike (a step
of two calls sampled by ``seq % 2**k`` would keep only its second call)."""

from __future__ import annotations

from typing import Any

import pytest

from cclctl.records import COMPLETED, CollectiveRecord
from cclctl.slow_signals import MAX_ENTRIES, sample_entries, seq_hash
from cclctl.telemetry.recorder import Recorder
from cclctl.telemetry.windows import Windows

S = 1_000_000_000
T0 = 1_733_400_000 * S  # a multiple of the window


def _positions(seqs: list[int], calls_per_step: int) -> list[int]:
    """How many kept seqs fall at each position of a step."""
    return [sum(1 for s in seqs if s % calls_per_step == p) for p in range(calls_per_step)]


@pytest.mark.parametrize("calls_per_step", [2, 3, 4, 8])
@pytest.mark.parametrize("calls", [300, 1_000, 20_000])
def test_every_position_of_a_step_is_sampled_alike(calls_per_step: int, calls: int) -> None:
    start = 7 * calls  # a window deep into the job: seqs need not start at 1
    kept = [s for s, _ in sample_entries((s, s) for s in range(start, start + calls))]
    assert MAX_ENTRIES // 4 < len(kept) <= MAX_ENTRIES
    fair = len(kept) / calls_per_step
    counts = _positions(kept, calls_per_step)
    assert all(0.4 * fair <= c <= 1.8 * fair for c in counts), counts


def test_levels_nest_so_a_window_thinned_as_it_fills_keeps_what_sampling_all_keeps() -> None:
    seqs = range(1, 5_000)
    for bits in range(1, 10):
        coarse = {s for s in seqs if not seq_hash(s) & ((1 << bits) - 1)}
        finer = {s for s in seqs if not seq_hash(s) & ((1 << (bits - 1)) - 1)}
        assert coarse <= finer
        assert 0.3 * len(seqs) / 2**bits < len(coarse) < 1.7 * len(seqs) / 2**bits


class _Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _rec(seq: int, op: str, start: int) -> CollectiveRecord:
    rec = CollectiveRecord("0:0-3", seq, op, start_ns=start)
    rec.state, rec.end_ns = COMPLETED, start + 1000
    return rec


def _window_entries(offset_ns: int) -> list[tuple[int, int]]:
    """A rank's sampled entries over one window of a loop of all_reduce then broadcast,
    500 steps, entering at ``offset_ns`` into each step."""
    clock = _Clock(T0)
    recorder: Any = Recorder(1000)
    recorder.windows = Windows(5.0, None, clock)
    for step in range(500):
        at = T0 + offset_ns + step * 9_000_000
        recorder.start(_rec(2 * step + 1, "all_reduce", at))
        recorder.start(_rec(2 * step + 2, "broadcast", at + 1_000_000))
        if step % 50 == 49:
            recorder.fold()
    clock.now = T0 + 5 * S
    sig = recorder.signals()
    assert sig is not None
    return sig.windows[0].comms["0:0-3"].entries


def test_a_loop_of_two_calls_a_step_keeps_entries_of_both_on_every_rank() -> None:
    first, late = _window_entries(0), _window_entries(3_000_000)
    assert [s for s, _ in first] == [s for s, _ in late]  # the same calls on every rank
    all_reduces, broadcasts = _positions([s for s, _ in first], 2)[::-1]
    assert len(first) <= MAX_ENTRIES
    assert all_reduces >= len(first) // 4 and broadcasts >= len(first) // 4
