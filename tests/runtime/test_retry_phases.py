"""Calls that end with a confirm ride through a link cut in any phase, exactly, keeping no copy.

Two real ranks over TCP (``cclctl launch``), ``CCLCTL_RETRY_BUDGET`` on, calls of 2-4 MiB
(from ``rerun.CONFIRM_FROM``: each ends with a one-byte confirm instead of keeping a copy
of its result): an in-place all_reduce cut in its reduce-scatter, in its all-gather (its
buffer then holds its own reduced share beside the input: restored from the saved input)
and in its confirm (both ranks hold the whole result, neither returned: both run it
again); an all_gather, an in-place broadcast and a reduce_scatter cut in their data. Then
each of the four with one rank's confirm message lost after it got the other's: that rank
returns and fails its next call, and the rank still inside the call returns the result it
holds (nothing moves, :data:`~cclctl.runtime.comm.recovery.retry_rules.HELD`), and ``cclctl diagnose
hang`` reads the dumps as healthy. Every rank's every result has the bits of a fault-free
run (random float32 inputs: a sum taken twice or in another order would differ). And the
plan the ranks make from such entries. Needs no root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from retry_phase_worker import call_input, digest

from cclctl.errors import CommError
from cclctl.runtime.comm import rerun
from cclctl.runtime.comm.recovery.retry_catchup import serve
from cclctl.runtime.comm.recovery.retry_plan import decide
from cclctl.runtime.comm.recovery.retry_rules import HELD, HELD_ALGO, Ask, Plan
from cclctl.runtime.comm.recovery.retrying import Retrying
from cclctl.runtime.comm.rerun import CONFIRM_FROM, CONFIRM_STEP0, Ending, Inputs, Kept
from scripts import script

WORLD, JOB = 2, "retryphases"
COUNT = 1 << 19  # 2 MiB of float32: every call below ends with a confirm
CONFIRM = CONFIRM_STEP0 + 1  # 2 ranks' confirm: one round of recursive doubling
#: seq -> (call, rank, step, peer, how) of each cut; the seq after a lost confirm message
#: is where the rank that lost it fails (a plain call, cut nowhere)
CUTS: dict[int, tuple[str, int, int, int, str]] = {
    1: ("sum", 0, 0, 1, "cut"),  # the reduce-scatter
    2: ("sum", 1, 1, 0, "cut"),  # the all-gather: the own share already reduced in place
    3: ("sum", 0, CONFIRM, 1, "cut"),  # the confirm: both ranks hold the result
    4: ("sum", 0, CONFIRM, 1, "lose"),
    6: ("gather", 1, 0, 0, "cut"),
    7: ("gather", 1, CONFIRM, 0, "lose"),
    9: ("bcast", 1, 1, 0, "cut"),  # the chain's second segment: the root may be done
    10: ("bcast", 0, CONFIRM, 1, "lose"),
    12: ("scatter", 0, 0, 1, "cut"),
    13: ("scatter", 1, CONFIRM, 0, "lose"),
}
CALLS = [CUTS[seq][0] if seq in CUTS else "sum" for seq in range(1, 15)]
LOST = [seq for seq, cut in CUTS.items() if cut[4] == "lose"]


def _expected(seq: int, call: str, rank: int) -> str:
    """What rank ``rank``'s seq ``seq`` gives in a fault-free run (2 ranks: a sum is one
    float32 addition per element, whichever rank adds)."""
    if call == "sum":
        return digest(call_input(seq, 0, COUNT) + call_input(seq, 1, COUNT))
    if call == "gather":
        return digest(np.concatenate([call_input(seq, r, COUNT) for r in range(WORLD)]))
    if call == "bcast":
        return digest(call_input(seq, 0, COUNT))
    total = call_input(seq, 0, WORLD * COUNT) + call_input(seq, 1, WORLD * COUNT)
    return digest(total[rank * COUNT : (rank + 1) * COUNT])


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_cut_in_every_phase_of_a_confirmed_call_is_retried_exactly(tmp_path: Path) -> None:
    assert COUNT * 4 >= CONFIRM_FROM
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    env |= {
        "CCLCTL_JOB": JOB,
        "CCLCTL_TRACE_DIR": str(tmp_path),
        "CCLCTL_TRANSPORT": "tcp",
        "CCLCTL_RETRY_BUDGET": "30",
        "COUNT": str(COUNT),
        "CALLS": ",".join(CALLS),
        "CUTS": ";".join(
            ":".join(map(str, (r, s, st, p, how))) for s, (_, r, st, p, how) in CUTS.items()
        ),
    }
    launch = [sys.executable, "-m", "cclctl", "launch", "-n", str(WORLD), "--", sys.executable]
    cmd = [*launch, script("retry_phase_worker.py")]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=140)
    assert out.returncode == 0, out.stdout + out.stderr
    for rank in range(WORLD):
        lines = [ln.split("] ", 1)[-1] for ln in out.stdout.splitlines() if f"[rank {rank}]" in ln]
        results = [ln.split()[1:] for ln in lines if ln.startswith("result ")]
        want = [[str(i + 1), _expected(i + 1, c, rank)] for i, c in enumerate(CALLS)]
        assert results == want, lines
        ends = [ln for ln in lines if not ln.startswith("result ")]
        assert f"epoch {len(CUTS)}" in ends and "done" in ends, ends
        doc: dict[str, Any] = json.loads((tmp_path / f"cclctl-{JOB}-rank{rank}.json").read_text())
        assert doc["counters"]["retries"] == len(CUTS), doc["counters"]
        for seq in LOST:  # closed on both ranks by a record of its own, nothing moved
            runs = [(r["epoch"], r["algo"], r["state"]) for r in doc["records"] if r["seq"] == seq]
            assert runs[-1][1:] == (HELD_ALGO, "completed"), (seq, runs)
            assert runs[-1][0] > runs[0][0], (seq, runs)
    diag = subprocess.run(  # the held seqs read as completed on every rank
        [sys.executable, "-m", "cclctl", "diagnose", "hang", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert diag.returncode == 0, diag.stdout + diag.stderr
    assert "HEALTHY" in diag.stdout, diag.stdout


# ---------------------------------------------------------------- the pieces, unit by unit
def _ask(call: str, pending: int, ops: str = "", done: int = 0) -> Ask:
    n = len(ops.split(",")) if ops else 0
    return Ask(call, pending, pending - 1 if n else 0, 2, 0.0, pending - n if n else 0, ops, done)


def test_a_rank_inside_a_confirmed_call_another_completed_returns_what_it_holds() -> None:
    """Rank 1 completed seq 4 (its confirm passed), ranks 0 and 2 are inside it with their
    results whole: seq 4 is HELD, then every rank re-runs seq 5."""
    ahead = _ask("all_reduce", 5, "all_reduce*")
    entries = {0: _ask("all_reduce", 4, done=4), 1: ahead, 2: _ask("all_reduce", 4, done=4)}
    assert decide(0, entries) == Plan(4, (HELD,))
    entries[2] = _ask("all_reduce", 4)  # a rank behind without its result: cannot be
    with pytest.raises(CommError, match=r"rank\(s\) 2 do not hold its result"):
        decide(0, entries)
    with pytest.raises(CommError, match="at seq 4 were in different calls"):
        decide(0, {0: _ask("all_gather", 4, done=4), 1: ahead})


def test_a_confirmed_call_keeps_no_copy_and_drops_the_calls_before_it() -> None:
    kept = Kept()
    a = np.arange(8.0)
    kept.keep(1, a, "broadcast")
    kept.hold(2, "broadcast")
    assert (kept.oldest, kept.seq, kept.ops(), kept.result) == (2, 2, "broadcast*", None)
    assert kept._bytes == 0
    held = kept.get(2)
    assert held is not None and held.held and held.data is None
    lent = kept.borrow(a)  # a saved input, in the buffer seq 1 left
    assert lent.tolist() == a.tolist() and lent is not a
    kept.give_back(lent)
    assert kept.borrow(a + 1) is lent  # reused, not allocated again
    f4 = np.dtype(np.float32)
    assert Ending.of("all_reduce", CONFIRM_FROM, f4).confirm
    assert not Ending.of("all_reduce", CONFIRM_FROM - 1, f4).confirm
    assert not Ending.of("reduce", 1 << 30, f4).confirm


def _retrying(plan: Plan, completed: int, kept: Kept, opened: list[tuple[str, str]]) -> Retrying:
    class _Opened:
        def __init__(self, op: str, arr: np.ndarray, algo: str, **size: int) -> None:
            opened.append((op, algo))

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

    port = SimpleNamespace(
        rank=0, kept=kept, record=_Opened, completed=completed,
        rewind=lambda seq, attempt: None,
    )  # fmt: skip
    return Retrying(port, lambda comm, ask: plan)  # type: ignore[arg-type]


def test_a_held_seq_is_closed_with_a_record_and_moves_nothing() -> None:
    """The rank behind returns (answered) from its own buffer; a rank ahead serving the
    catch-up opens the same seq's record; neither broadcasts."""
    opened: list[tuple[str, str]] = []
    dst = np.ones(4)
    retrying = _retrying(Plan(4, (HELD,)), 3, Kept(), opened)
    answered, _ = retrying.recover("all_reduce", 4, CommError("cut"), 2, 1e18, dst, True)
    assert answered and dst.tolist() == [1.0] * 4
    kept = Kept()
    kept.hold(4, "all_reduce")
    serve(_retrying(Plan(4, (HELD,)), 4, kept, opened).port, Plan(4, (HELD,)), 5)
    assert opened == [("all_reduce", HELD_ALGO)] * 2


def test_an_in_place_input_is_saved_in_a_reused_buffer() -> None:
    kept = Kept()
    buf = np.arange(6.0)
    first = Inputs.of(buf, buf, spare=kept)
    assert first.saved is not None and first.saved.tolist() == buf.tolist()
    buf[...] = -1
    first.restore()
    assert buf.tolist() == list(np.arange(6.0))
    kept.give_back(first.saved)
    assert Inputs.of(buf, buf, spare=kept).saved is first.saved
    assert Inputs.of(buf, np.empty(6), spare=kept).saved is None  # out of place: none


def test_freed_buffers_are_lent_again_newest_first_within_their_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Buffers given back are lent again newest first; the least recently freed go past
    ``_FREE_MAX_BYTES`` beyond the newest, or past ``_FREE_MAX`` buffers."""
    monkeypatch.setattr(rerun, "_FREE_MAX_BYTES", 2 * 80)
    kept = Kept()
    a, b, c = (np.zeros(10) for _ in range(3))  # 80 bytes each
    for buf in (a, b, c):
        kept.give_back(buf)  # beyond c: b and a, 160 bytes: all held
    lent = [kept.borrow(np.ones(10)) for _ in range(3)]
    assert lent[0] is c and lent[1] is b and lent[2] is a
    big = np.zeros(30)
    for buf in (big, a, b):
        kept.give_back(buf)  # beyond a: big, 240 bytes: it goes
    assert kept.borrow(np.ones(30)) is not big
    assert kept.borrow(np.ones(10)) is b and kept.borrow(np.ones(10)) is a
    many = [np.zeros(1) for _ in range(rerun._FREE_MAX + 2)]
    for buf in many:
        kept.give_back(buf)  # the first two go
    lent = [kept.borrow(np.ones(1)) for _ in range(rerun._FREE_MAX + 1)]
    assert [id(x) for x in lent[:-1]] == [id(x) for x in reversed(many[2:])]
    assert all(lent[-1] is not x for x in many)
