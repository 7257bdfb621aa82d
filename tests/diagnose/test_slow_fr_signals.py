"""PyTorch Flight Recorder entries as slowness signals (cclctl/diagnose_io/fr_signals.py),
and ``diagnose slow`` over folders of Flight Recorder dumps, alone or beside cclctl's.

The entries are built the way torch 2.x writes them (``process_group`` (name, desc),
``collective_seq_id``, ``time_created_ns``; gloo leaves the end times None), for a job of
ranks that call an all_reduce every ``period`` after a step of compute, one of them later.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from slow_factory import Job, documents

from cclctl.diagnose.slow import analyse
from cclctl.diagnose.slow_model import RankSignals, SlowOptions
from cclctl.diagnose_io import sources
from cclctl.diagnose_io.fr_signals import (
    MAX_TIME_NS,
    FrCall,
    calls_of,
    infer_inside,
    rank_windows,
)
from cclctl.diagnose_io.fr_slow_inputs import SOURCE_NOTE
from cclctl.diagnose_io.slow_inputs import slow_from_inputs
from cclctl.slow_signals import MAX_ENTRIES, MAX_WINDOWS, Signals

MS = 1_000_000
S = 1_000 * MS
T0 = 1_796_000_000 * S  # a multiple of every window used here
EXIT_OK, EXIT_FAULT = 0, 3


def entry(seq: int, created: object, group: str = "0", **more: object) -> dict[str, Any]:
    return {
        "collective_seq_id": seq,
        "process_group": [group, "default_pg"],
        "profiling_name": "gloo:all_reduce",
        "is_p2p": False,
        "time_created_ns": created,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        **more,
    }


def job_entries(
    rank: int, late: int | None, steps: int = 100, period_ms: int = 80, lag_ms: int = 30
) -> list[dict[str, Any]]:
    """One rank's entries: a call every ``period_ms``; rank ``late`` enters ``lag_ms``
    after the others (which enter within 0-3 ms of each other)."""
    out = []
    for k in range(steps):
        at = T0 + 300 * MS + k * period_ms * MS + (rank * 997 * k) % (3 * MS)
        if rank == late:
            at += lag_ms * MS
        out.append(entry(k + 1, at))
    return out


def signals_of(world: int, late: int | None, window_s: float = 1.0) -> list[RankSignals]:
    ranks = {}
    for rank in range(world):
        calls = calls_of(job_entries(rank, late))
        ranks[rank] = rank_windows(calls.calls, window_s, {"0": f"0:0-{world - 1}"})
    infer_inside(ranks, list(ranks))
    return [RankSignals(r, "", s.window_s, s.windows) for r, s in sorted(ranks.items())]


# -- entries ------------------------------------------------------------------------------


def test_usable_entries_become_calls_and_point_to_point_ones_are_set_aside() -> None:
    found = calls_of(
        [
            entry(1, T0),
            entry(2, str(T0 + 5), group="1"),  # JSON dumps write numbers as text
            {**entry(0, T0 + 9), "is_p2p": True, "p2p_seq_id": 1},
            entry(3, T0 + 10, time_discovered_completed_ns=T0 + 40),
            entry(4, T0 + 50, duration_ms=2.5),
        ]
    )
    assert found.calls == [
        FrCall("0", 1, T0, 0),
        FrCall("1", 2, T0 + 5, 0),
        FrCall("0", 3, T0 + 10, T0 + 40),
        FrCall("0", 4, T0 + 50, T0 + 50 + 2_500_000),
    ]
    assert (found.skipped, found.p2p, found.timed) == (0, 1, True)
    assert calls_of([entry(1, T0)]).timed is False


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("not an entry", "an entry is not a mapping"),
        ({"collective_seq_id": 1, "time_created_ns": T0}, "an entry names no process group"),
        (entry(None, T0), "no usable collective_seq_id"),
        (entry(True, T0), "no usable collective_seq_id"),
        (entry(-1, T0), "no usable collective_seq_id"),
        (entry(10**40, T0), "no usable collective_seq_id"),
        (entry(1, None), "no usable time_created_ns"),
        (entry(1, 0), "no usable time_created_ns"),
        (entry(1, MAX_TIME_NS + 1), "no usable time_created_ns"),
        (entry(1, "9" * 400), "no usable time_created_ns"),
        (entry(1, 1.5e18), "no usable time_created_ns"),
    ],
)
def test_a_malformed_entry_is_skipped_and_said_never_raised(bad: object, why: str) -> None:
    found = calls_of([entry(1, T0), bad, entry(2, T0 + 1)])
    assert [c.seq for c in found.calls] == [1, 2]
    assert found.skipped == 1 and why in found.why


@pytest.mark.parametrize(
    "end",
    [
        {"time_discovered_completed_ns": T0 - 1},  # before the call began
        {"time_discovered_completed_ns": 1 << 80},
        {"duration_ms": float("inf")},
        {"duration_ms": float("nan")},
        {"duration_ms": -3.0},
        {"duration_ms": 1e30},
        {"duration_ms": "12"},
    ],
)
def test_an_implausible_end_is_not_known_and_the_call_still_counts(end: dict[str, Any]) -> None:
    found = calls_of([entry(7, T0, **end)])
    assert found.calls == [FrCall("0", 7, T0, 0)] and found.skipped == 0


def test_entries_that_are_not_a_list_give_no_calls() -> None:
    found = calls_of({"0": entry(1, T0)})
    assert found.calls == [] and "not a list" in found.why


# -- windows ------------------------------------------------------------------------------


def test_windows_hold_calls_time_inside_and_entries_and_partial_ones_are_left_out() -> None:
    # 10 calls per 1 s window from T0 + 0.5 s to T0 + 4.4 s, each 20 ms long
    calls = [FrCall("0", k, T0 + 500 * MS + k * 100 * MS, T0 + 520 * MS + k * 100 * MS)
             for k in range(40)]  # fmt: skip
    got = rank_windows(calls, 1.0, {"0": "0:0-3"})
    # windows 0 (holds the first call) and 4 (the last) are partial: 1, 2 and 3 remain
    assert [(w.start_ns - T0) // S for w in got.windows] == [1, 2, 3]
    for window in got.windows:
        comm = window.comms["0:0-3"]
        assert comm.calls == 10 and comm.inside_ns == 10 * 20 * MS
        assert [e[1] for e in comm.entries] == sorted(
            c.enter_ns for c in calls if window.start_ns <= c.enter_ns < window.end_ns
        )
        assert window.peers == {}
    assert got.window_s == 1.0


def test_a_call_across_a_boundary_splits_its_time_and_ends_in_the_later_window() -> None:
    calls = [FrCall("0", 1, T0 + 100 * MS, T0 + 200 * MS),
             FrCall("0", 2, T0 + S + 900 * MS, T0 + 2 * S + 300 * MS),
             FrCall("0", 3, T0 + 3 * S + 500 * MS, T0 + 3 * S + 600 * MS)]  # fmt: skip
    one, two = rank_windows(calls, 1.0, {}).windows
    assert (one.comms["0"].calls, one.comms["0"].inside_ns) == (0, 100 * MS)
    assert (two.comms["0"].calls, two.comms["0"].inside_ns) == (1, 300 * MS)
    assert [s for s, _ in one.comms["0"].entries] == [2]


def test_only_the_newest_windows_and_a_sample_of_entries_are_kept() -> None:
    calls = [FrCall("0", k, T0 + k * 10 * MS) for k in range(30 * 100)]  # 30 windows of 100
    got = rank_windows(calls, 1.0, {})
    assert len(got.windows) == MAX_WINDOWS
    assert got.windows[-1].end_ns == T0 + 29 * S  # the 30th window holds the last call
    assert all(len(w.comms["0"].entries) <= MAX_ENTRIES for w in got.windows)
    assert all(w.comms["0"].calls == 100 for w in got.windows)
    assert Signals.from_dict(got.to_dict()).to_dict() == got.to_dict()  # a valid document


def test_no_calls_give_no_windows() -> None:
    assert rank_windows([], 5.0, {}).windows == []


def test_without_end_times_the_wait_for_the_last_member_is_the_time_inside() -> None:
    ranks = {r: Signals(1.0, s.windows) for r, s in
             ((s.rank, s) for s in signals_of(3, late=2))}  # fmt: skip
    for rank, sig in ranks.items():
        for window in sig.windows:
            comm = window.comms["0:0-2"]
            per_call = comm.inside_ns / comm.calls
            if rank == 2:
                assert per_call == 0
            else:
                assert 27 * MS <= per_call <= 33 * MS, (rank, per_call)


# -- the analysis over them ---------------------------------------------------------------


@pytest.mark.parametrize("late", [0, 3])
def test_a_late_rank_in_flight_recorder_entries_is_the_straggler(late: int) -> None:
    report = analyse(signals_of(4, late), options=SlowOptions(ongoing=False))
    assert [(f.kind, f.ranks) for f in report.findings] == [("slow_rank", [late])]


def test_entries_that_keep_together_are_healthy() -> None:
    report = analyse(signals_of(4, None), options=SlowOptions(ongoing=False))
    assert report.status == "healthy" and report.windows_judged >= 2


# -- folders of dumps ---------------------------------------------------------------------


def write_fr(folder: Path, ranks: range, late: int | None) -> None:
    folder.mkdir(exist_ok=True)
    for rank in ranks:
        doc = {"version": "2.10", "pg_config": {}, "pg_status": {},
               "entries": job_entries(rank, late)}  # fmt: skip
        (folder / f"fr_rank{rank}.json").write_text(json.dumps(doc))


def judge(folder: Path) -> Any:
    paths = [str(folder)]
    return slow_from_inputs(sources.load(paths), SlowOptions(ongoing=False), paths)


def test_a_folder_of_flight_recorder_dumps_names_the_straggler_and_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CCLCTL_SLOW_WINDOW", "1")
    write_fr(tmp_path, range(4), late=1)
    report = judge(tmp_path)
    assert [(f.kind, f.ranks) for f in report.findings] == [("slow_rank", [1])]
    assert "look at what rank 1 does between" in report.findings[0].next_step  # no host, pid
    assert report.ranks_seen == 4
    assert report.reason.endswith(f"ranks 0-3 {SOURCE_NOTE}")
    assert f"ranks 0-3: {SOURCE_NOTE}" in report.notes
    assert not any("left out" in note for note in report.notes)


def test_without_the_paths_flight_recorder_dumps_are_left_out(tmp_path: Path) -> None:
    write_fr(tmp_path, range(4), late=1)
    report = slow_from_inputs(sources.load([str(tmp_path)]))
    assert report.status == "unjudged" and report.ranks_seen == 0


def test_a_rank_with_both_dumps_is_read_from_cclctls_alone(tmp_path: Path) -> None:
    # cclctl's dumps of 4 ranks, rank 3 the straggler; Flight Recorder dumps of the same
    # ranks say rank 0 is: cclctl's signals are every rank's, none is counted twice
    for snap in documents(Job(slow={3})):
        (tmp_path / f"cclctl-{snap.job}-rank{snap.rank}.json").write_text(snap.to_json())
    write_fr(tmp_path, range(4), late=0)
    report = judge(tmp_path)
    assert [(f.kind, f.ranks) for f in report.findings] == [("slow_rank", [3])]
    assert report.ranks_seen == 4
    assert not any(SOURCE_NOTE in note for note in report.notes)


def test_flight_recorder_ranks_beside_cclctls_are_compared_among_themselves(
    tmp_path: Path,
) -> None:
    # cclctl's healthy ranks 0-1 (windows 1-3 of 1 s after T0) beside Flight Recorder
    # ranks 2-4 of the same seconds, rank 4 late: the straggler is found among the latter
    for snap in documents(Job(n=2, window_s=1.0, windows=3, start_ns=T0 + S)):
        (tmp_path / f"cclctl-{snap.job}-rank{snap.rank}.json").write_text(snap.to_json())
    write_fr(tmp_path, range(2, 5), late=4)
    report = judge(tmp_path)  # the FR windows take the cclctl dumps' 1 s
    assert [(f.kind, f.ranks) for f in report.findings] == [("slow_rank", [4])]
    assert report.ranks_seen == 5 and report.window_s == 1.0
    assert set(report.figures) == {0, 1, 2, 3, 4}
    assert f"ranks 2-4: {SOURCE_NOTE}" in report.notes
    assert any("only among their own kind" in note for note in report.notes)


def test_the_cli_reads_a_flight_recorder_folder_and_exits_3_or_0(tmp_path: Path) -> None:
    slow_dir, healthy_dir = tmp_path / "slow", tmp_path / "healthy"
    write_fr(slow_dir, range(4), late=2)
    write_fr(healthy_dir, range(4), late=None)
    env = {"CCLCTL_SLOW_WINDOW": "1", "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "cclctl", "diagnose", "slow", "--json"]
    slow = subprocess.run([*cmd, str(slow_dir)], capture_output=True, text=True, timeout=60,
                          env=env)  # fmt: skip
    assert slow.returncode == EXIT_FAULT, slow.stderr
    assert [f["ranks"] for f in json.loads(slow.stdout)["findings"]] == [[2]]
    healthy = subprocess.run([*cmd, str(healthy_dir)], capture_output=True, text=True,
                             timeout=60, env=env)  # fmt: skip
    assert healthy.returncode == EXIT_OK, healthy.stderr
    assert json.loads(healthy.stdout)["status"] == "healthy"
    bad = subprocess.run([*cmd, str(healthy_dir)], capture_output=True, text=True, timeout=60,
                         env={**env, "CCLCTL_SLOW_WINDOW": "0"})  # fmt: skip
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
