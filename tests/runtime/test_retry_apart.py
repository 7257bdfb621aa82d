"""A link fault that leaves the ranks many calls apart is retried, exactly.

A run of broadcasts under ``rerun.CONFIRM_FROM`` tells its root nothing: over TCP, the
ranks upstream of a cut link finish calls (their sends end in the kernel's buffers) that
the ranks downstream never got, so a retry finds them calls apart, or already closing.
Four real ranks over TCP (``cclctl launch``), ``CCLCTL_RETRY_BUDGET`` on, a link cut at
several seqs and between several ranks of a loop of 256 KiB broadcasts, and of 4 MiB ones
(which end with a confirm, so none gets ahead): every rank's every result is the exact one
and the job exits 0. Then cases made on purpose (rank 3 holds until the others reached a
given call): ranks three calls apart with a reduce among the calls to catch up, run again
from its kept input; and rank 3 cutting its link after the others finished all 20
broadcasts and are closing: in ``close()``, they serve the 16 calls rank 3 lacks from
what they kept. And the plan the ranks make from their entries, what a rank keeps, and a
rank between the others serving the seqs it completed before it takes its own. Needs no
root.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from retry_apart_worker import call_input

from cclctl.errors import CommError
from cclctl.runtime.comm.recovery.call import Call
from cclctl.runtime.comm.recovery.retry_plan import decide
from cclctl.runtime.comm.recovery.retry_rules import REPLAY, Ask, Plan
from cclctl.runtime.comm.recovery.retrying import Retrying
from cclctl.runtime.comm.rerun import Kept
from scripts import script

WORLD, JOB = 4, "retryapart"


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(a.astype(np.float32).tobytes()).hexdigest()


def _expected(calls: list[str], iters: int, count: int, rank: int) -> list[list[str]]:
    """What rank ``rank`` prints of a fault-free run, exact."""
    want = []
    for i in range(iters):
        call = calls[i % len(calls)]
        if call == "bcast":
            want.append([str(i), call, _digest(call_input(i, 0, count))])
        elif rank == 0 or call == "sum":
            xs = [call_input(i, r, count).astype(np.float64) for r in range(WORLD)]
            want.append([str(i), call, _digest(np.sum(xs, axis=0))])
    return want


def _launch(tmp: Path, fault: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    base |= {
        "CCLCTL_JOB": JOB,
        "CCLCTL_TRACE_DIR": str(tmp),
        "CCLCTL_TRANSPORT": "tcp",
        "CCLCTL_RETRY_BUDGET": "20",
        "CCLCTL_FAULT": fault,
    }
    launch = [sys.executable, "-m", "cclctl", "launch", "-n", str(WORLD), "--", sys.executable]
    cmd = [*launch, script("retry_apart_worker.py")]
    return subprocess.run(cmd, env=base | env, capture_output=True, text=True, timeout=100)


def _lines(out: str, rank: int) -> list[str]:
    return [ln.split("] ", 1)[-1] for ln in out.splitlines() if f"[rank {rank}]" in ln]


def _check_results(out: subprocess.CompletedProcess[str], calls: list[str], iters: int,
                   count: int) -> None:  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    for rank in range(WORLD):
        lines = _lines(out.stdout, rank)
        results = [ln.split()[1:] for ln in lines if ln.startswith("result ")]
        assert results == _expected(calls, iters, count, rank), lines
        assert "done" in lines, lines


def _dump(tmp: Path, rank: int) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((tmp / f"cclctl-{JOB}-rank{rank}.json").read_text())
    return doc


#: (rank, seq, peer) of each cut: downstream and upstream in the broadcasts' chain, at the
#: start, the middle and the last call, and the root's own link.
CUTS = [(2, 5, 3), (1, 3, 2), (3, 9, 2), (0, 12, 1), (2, 19, 1)]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("count", [1 << 16, 1 << 20], ids=["256KiB-kept", "4MiB-confirmed"])
@pytest.mark.parametrize(("rank", "seq", "peer"), CUTS)
def test_a_link_cut_in_a_run_of_broadcasts_is_retried_exactly(
    tmp_path: Path, rank: int, seq: int, peer: int, count: int
) -> None:
    """20 broadcasts from rank 0, back to back. Of 256 KiB: the ranks upstream of the cut
    run calls ahead (or finish and close) before the fault reaches them, and catch the
    others up from what they kept. Of 4 MiB (from ``rerun.CONFIRM_FROM``): each ends with
    a confirm, so no rank gets a call ahead, and nothing is kept. Every result is exact,
    and every rank counts the retry."""
    out = _launch(tmp_path, f"link:rank={rank}:seq={seq}:peer={peer}", ITERS="20",
                  COUNT=str(count))  # fmt: skip
    _check_results(out, ["bcast"], 20, count)
    for r in range(WORLD):
        assert _dump(tmp_path, r)["counters"]["retries"] >= 1, r


def _held(tmp: Path, fault: str, hold_at: int, hold_for: str, **env: str) -> Any:
    """Launch with rank 3 holding before its call ``hold_at`` until the others returned
    from the calls ``hold_for`` names (``<rank>_<call index>,...``)."""
    hold = tmp / "hold"
    hold.mkdir()
    held = {"HOLD": str(hold), "HOLD_RANK": "3", "HOLD_AT": str(hold_at), "HOLD_FOR": hold_for}
    return _launch(tmp, fault, **env, **held)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_reduce_among_the_calls_a_rank_behind_lacks_is_run_again_exactly(
    tmp_path: Path,
) -> None:
    """Broadcasts and reduces of 1 KiB (tree algorithms): rank 3 holds before seq 5 until
    rank 1, a leaf of the reduce, has completed seq 6 (a reduce, whose result differs by
    rank); then it cuts its link to rank 2. Rank 3 is at seq 5, ranks 0 and 2 at 6, rank 1
    at 7: seq 5 is caught up from rank 0, rank 1 runs the reduce of seq 6 again from its
    kept input with the others, and all re-run seq 7. Every result is exact."""
    calls, count = "bcast,reduce", 256
    env = {"ITERS": "12", "COUNT": str(count), "CALLS": calls}
    out = _held(tmp_path, "link:rank=3:seq=5:peer=2", 4, "1_5", **env)
    _check_results(out, calls.split(","), 12, count)
    runs = [(r["seq"], r["epoch"], r["state"]) for r in _dump(tmp_path, 1)["records"]]
    assert (6, 0, "completed") in runs and (6, 1, "completed") in runs, runs  # ran again
    assert (7, 0, "aborted") in runs and (7, 1, "completed") in runs, runs


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ranks_sixteen_calls_apart_catch_up_from_ranks_that_are_closing(tmp_path: Path) -> None:
    """Rank 3 holds before its fifth call until ranks 0-2 finished all 20 broadcasts (64 KiB
    each, held in the kernel's buffers) and are closing, then cuts its link to rank 2 at
    seq 5. Ranks 0-2 hear of it in ``close()``, join the retry and serve seqs 5-20 from
    what they kept: rank 3's results are exact, each of those seqs completed in epoch 1."""
    env = {"ITERS": "20", "COUNT": "16384"}
    out = _held(tmp_path, "link:rank=3:seq=5:peer=2", 4, "0_19,1_19,2_19", **env)
    _check_results(out, ["bcast"], 20, 16384)
    for rank in range(3):  # they completed every call before the fault: 16 calls ahead
        assert "epoch 0" in _lines(out.stdout, rank), _lines(out.stdout, rank)
        assert _dump(tmp_path, rank)["counters"]["retries"] == 1, rank
    records = _dump(tmp_path, 3)["records"]
    failed = [(r["seq"], r["epoch"]) for r in records if r["state"] == "failed"]
    assert failed == [(5, 0)], records
    caught = {r["seq"] for r in records if r["epoch"] == 1 and r["state"] == "completed"}
    assert caught >= set(range(5, 21)), records


# ---------------------------------------------------------------- the plan, unit by unit
def _ask(call: str, pending: int, ops: str = "", kept_from: int = 1) -> Ask:
    """An entry at ``pending`` keeping the seqs from ``kept_from`` whose ops ``ops`` names."""
    n = len(ops.split(",")) if ops else 0
    return Ask(call, pending, kept_from + n - 1 if n else 0, 2, 0.0, kept_from if n else 0, ops)


def _bcasts(n: int) -> str:
    return ",".join(["broadcast"] * n)


def test_ranks_calls_apart_catch_up_each_seq_from_the_lowest_rank_ahead() -> None:
    """Ranks 0-1 completed seqs 1-7, rank 2 seqs 1-5, rank 3 seqs 1-4: seqs 5, 6 and 7 are
    caught up from rank 0 (seq 5 also by rank 2, which completed it), then seq 8 re-runs."""
    entries = {
        0: _ask("broadcast", 8, _bcasts(7)), 1: _ask("broadcast", 8, _bcasts(7)),
        2: _ask("broadcast", 6, _bcasts(5)), 3: _ask("broadcast", 5, _bcasts(4)),
    }  # fmt: skip
    plan = decide(3, entries)
    assert plan == Plan(5, (0, 0, 0))
    assert (plan.rerun, plan.step(4), plan.step(5), plan.step(8)) == (8, None, 0, None)


def test_a_call_whose_result_differs_by_rank_is_replayed_among_the_catch_ups() -> None:
    ops = "broadcast,reduce,broadcast"  # seqs 4-6
    entries = {0: _ask("broadcast", 7, ops, 4), 1: _ask("broadcast", 4, "", 0)}
    assert decide(0, entries) == Plan(4, (0, REPLAY, 0))


def test_ranks_closing_at_the_highest_seq_serve_the_others_and_rerun_nothing() -> None:
    entries = {0: _ask("close", 21, _bcasts(20)), 1: _ask("broadcast", 6, _bcasts(5))}
    assert decide(1, entries) == Plan(6, (0,) * 15)
    with pytest.raises(CommError, match=r"rank\(s\) 0 were in close, which is not re-run"):
        decide(1, {0: _ask("close", 6, _bcasts(5)), 1: _ask("broadcast", 6, _bcasts(5))})


def test_a_seq_a_rank_ahead_no_longer_keeps_is_refused_at_once_naming_it() -> None:
    entries = {0: _ask("broadcast", 30, _bcasts(10), 20), 1: _ask("broadcast", 12, _bcasts(11))}
    with pytest.raises(CommError, match=r"rank\(s\) 0 no longer keep seq 12.*keeps seqs 20 to 29"):
        decide(1, entries)
    with pytest.raises(CommError, match="at seq 5 were in different calls"):
        decide(0, {0: _ask("broadcast", 7, "broadcast,all_reduce", 5), 1: _ask("reduce", 5)})


def test_a_rank_keeps_calls_since_the_last_one_every_rank_entered() -> None:
    """A broadcast or a reduce is kept beside the calls before it; an all_reduce (which
    every rank entered) drops them; past the bound the oldest go, their buffers reused."""
    kept = Kept(max_bytes=3 * 800)
    a = np.arange(100.0)
    kept.keep(1, a, "all_reduce", synced=True)
    for seq in (2, 3):
        kept.keep(seq, a + seq, "broadcast")
    assert (kept.oldest, kept.seq, kept.ops()) == (1, 3, "all_reduce,broadcast,broadcast")
    first = kept.get(1)
    assert first is not None
    held = first.data
    kept.keep(4, a + 4, "broadcast")  # past 3 calls' bytes: seq 1 goes, its buffer reused
    assert (kept.oldest, kept.seq) == (2, 4)
    newest = kept.get(4)
    assert newest is not None and newest.data is held and newest.data[0] == 4.0
    kept.keep(5, a, "all_gather", synced=True)
    assert (kept.oldest, kept.seq) == (5, 5)
    kept.keep(9, a, "broadcast")  # not the next seq: nothing older is contiguous with it
    assert (kept.oldest, kept.seq) == (9, 9)


def test_a_rank_between_serves_the_seqs_it_completed_before_it_takes_its_own() -> None:
    """Rank 1 completed seqs 5 and 6 of a run of broadcasts, rank 3 only seq 4, rank 0 all
    up to 7: rank 1 joins the catch-up broadcasts of seqs 5 and 6 (rank 0 their root) and
    only then takes its own seq 7's result, each at its seq."""
    kept = Kept()
    for seq in (5, 6):
        kept.keep(seq, np.full(4, float(seq)), "broadcast")
    ran: list[tuple[int, int]] = []
    seqs = iter(range(5, 10))

    def broadcast(call: Call) -> np.ndarray:
        assert call.op == "broadcast"
        ran.append((next(seqs), call.root))
        return call.buf

    port = SimpleNamespace(
        rank=1, kept=kept, attempt=broadcast, completed=6, rewind=lambda seq, attempt: None
    )
    retrying = Retrying(port, lambda comm, ask: Plan(5, (0, 0, 0)))  # type: ignore[arg-type]
    answered, _ = retrying.recover("broadcast", 7, CommError("cut"), 2, 1e18, np.zeros(4))
    assert answered
    assert ran == [(5, 0), (6, 0), (7, 0)]
