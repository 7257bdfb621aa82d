"""Every collective a retry re-runs rides through a link fault, exactly, on one host.

Three real ranks over TCP (``cclctl launch``), ``CCLCTL_RETRY_BUDGET`` on, links closed as
an all_gather (out of place, then in place), a broadcast in place and a barrier start
(``CCLCTL_FAULT=link:...``, each striking its seq's first attempt only): every result is
the exact one, every rank counts four retries and its records hold each faulted seq's
attempts. So do a reduce_scatter, a reduce, an all_to_all and an all_to_allv, whose
results differ by rank, and a reduce that left a rank a call ahead runs again with it. A
link cut in a send, which a retry does not re-run, fails the pair with the link's error
and tells the next epoch's agreement so: a rank that made no point-to-point call then fails
its all_reduce's retry at once, naming the pair. And the plan the ranks make from their
entries, and a retry the job's other failure ends. Needs no root.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from retry_mix_worker import CALLS, OPS, v_counts
from retry_worker import rank_input
from thread_ranks import run_ranks

from cclctl import revocation
from cclctl.config import RuntimeConfig
from cclctl.errors import CommError, InvalidArgument
from cclctl.revocation import Revocation
from cclctl.runtime.comm.recovery.call import Call
from cclctl.runtime.comm.recovery.retry_plan import decide
from cclctl.runtime.comm.recovery.retry_rules import REPLAY, RERUNS, Ask, Plan
from cclctl.runtime.comm.recovery.retrying import Retrying
from cclctl.runtime.comm.rerun import Kept
from cclctl.runtime.failure import FailureState
from cclctl.runtime.job.retry import Retry
from cclctl.store.client import StoreClient, StoreServer
from cclctl.store.scope import ScopedStore
from scripts import script

WORLD, COUNT, ITERS, JOB = 3, 65536, 2, "retrycalls"
#: seq -> (rank, peer) of each cut: iteration 0's gather_in_place (seq 2) and barrier (5),
#: iteration 1's gather (7) and bcast_in_place (9); none next to another, so each is one
#: retry (a cut at the seq after a catch-up strikes the re-run: a retry more)
CUTS = {2: (0, 1), 5: (1, 2), 7: (2, 1), 9: (2, 0)}


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(a.astype(np.float32).tobytes()).hexdigest()


def _expected() -> dict[str, str]:
    xs = [rank_input(r, COUNT) for r in range(WORLD)]
    gathered = _digest(np.concatenate(xs))
    total = _digest(np.sum([x.astype(np.float64) for x in xs], axis=0))
    return {
        "gather": gathered, "gather_in_place": gathered, "bcast_in_place": _digest(xs[-1]),
        "bcast": _digest(xs[0]), "sum": total,
    }  # fmt: skip


def _env(tmp: Path, fault: str, calls: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    return env | {
        "CCLCTL_JOB": JOB,
        "CCLCTL_TRACE_DIR": str(tmp),
        "CCLCTL_TRANSPORT": "tcp",
        "CCLCTL_RETRY_BUDGET": "20",
        "CCLCTL_FAULT": fault,
        "COUNT": str(COUNT),
        "ITERS": str(ITERS),
        "CALLS": calls or ",".join(CALLS),
    }


def _cmd() -> list[str]:
    launch = [sys.executable, "-m", "cclctl", "launch", "-n", str(WORLD), "--", sys.executable]
    return [*launch, script("retry_mix_worker.py")]


def _launch(tmp: Path, fault: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_cmd(), env=_env(tmp, fault), capture_output=True, text=True, timeout=80)


def _lines(out: str, rank: int) -> list[str]:
    return [ln.split("] ", 1)[-1] for ln in out.splitlines() if f"[rank {rank}]" in ln]


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_every_rerun_call_rides_through_a_cut_link_exactly(tmp_path: Path) -> None:
    fault = ";".join(f"link:rank={r}:seq={s}:peer={p}" for s, (r, p) in CUTS.items())
    out = _launch(tmp_path, fault)
    assert out.returncode == 0, out.stdout + out.stderr
    want = _expected()
    shown = [c for c in CALLS if c != "barrier"]
    for rank in range(WORLD):
        lines = _lines(out.stdout, rank)
        results = [ln.split()[1:] for ln in lines if ln.startswith("result ")]
        assert results == [[str(i), call, want[call]] for i in range(ITERS) for call in shown], (
            lines
        )
        assert f"epoch {len(CUTS)}" in lines, lines
        doc = json.loads((tmp_path / f"cclctl-{JOB}-rank{rank}.json").read_text())
        assert doc["counters"]["retries"] == len(CUTS), doc["counters"]
        for seq in CUTS:
            # a first attempt of the call that did not complete here or did on a rank ahead,
            # then a completed one of a later epoch: the call's re-run, or the broadcast of
            # its result from a rank ahead where the cut left the ranks one call apart
            op = OPS[CALLS[(seq - 1) % len(CALLS)]]
            runs = [r for r in doc["records"] if r["seq"] == seq]
            assert (runs[0]["op"], runs[0]["attempt"]) == (op, 1), (seq, runs)
            assert runs[-1]["state"] == "completed", (seq, runs)
            assert runs[-1]["epoch"] > runs[0]["epoch"], (seq, runs)
            assert {r["op"] for r in runs[1:]} <= {op, "broadcast"}, (seq, runs)


#: The calls whose result differs by rank, each after an all_reduce (a rank a call ahead
#: of the others then takes it from them): seqs 1, 3 and 5, cut as each starts.
BY_RANK = ("scatter", "sum", "reduce", "sum", "alltoall", "sum", "alltoallv", "sum")
BY_RANK_CUTS = {1: (0, 1), 3: (1, 2), 5: (2, 0), 7: (1, 0)}


def _by_rank_results(rank: int) -> list[list[str]]:
    """What rank ``rank`` prints of one pass of :data:`BY_RANK`, exact."""
    xs = [rank_input(r, COUNT) for r in range(WORLD)]
    total = _digest(np.sum([x.astype(np.float64) for x in xs], axis=0))
    k = COUNT // WORLD
    mine = _digest(np.concatenate([x[rank * k : (rank + 1) * k] for x in xs]))
    c = v_counts(WORLD, COUNT)
    starts = [sum(c[i][:rank]) for i in range(WORLD)]
    blocks = [xs[i][starts[i] : starts[i] + c[i][rank]] for i in range(WORLD)]
    want = {"scatter": total, "sum": total, "reduce": total, "alltoall": mine,
            "alltoallv": _digest(np.concatenate(blocks))}  # fmt: skip
    shown = [c for c in BY_RANK if c != "reduce" or rank == 0]  # the root's result only
    return [["0", call, want[call]] for call in shown]


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_the_calls_whose_result_differs_by_rank_ride_through_a_cut_link(tmp_path: Path) -> None:
    """A reduce_scatter, a reduce, an all_to_all and an all_to_allv, each cut as it starts:
    every result is exact, and every rank's records hold each cut seq's attempts."""
    fault = ";".join(f"link:rank={r}:seq={s}:peer={p}" for s, (r, p) in BY_RANK_CUTS.items())
    env = _env(tmp_path, fault, calls=",".join(BY_RANK)) | {"ITERS": "1"}
    out = subprocess.run(_cmd(), env=env, capture_output=True, text=True, timeout=80)
    assert out.returncode == 0, out.stdout + out.stderr
    for rank in range(WORLD):
        lines = _lines(out.stdout, rank)
        results = [ln.split()[1:] for ln in lines if ln.startswith("result ")]
        assert results == _by_rank_results(rank), lines
        doc = json.loads((tmp_path / f"cclctl-{JOB}-rank{rank}.json").read_text())
        assert doc["counters"]["retries"] >= len(BY_RANK_CUTS), doc["counters"]
        for seq in BY_RANK_CUTS:
            op = OPS[BY_RANK[seq - 1]]
            runs = [r for r in doc["records"] if r["seq"] == seq and r["peer"] is None]
            assert {r["op"] for r in runs} == {op}, (seq, runs)
            assert runs[-1]["state"] == "completed" and runs[-1]["attempt"] >= 2, (seq, runs)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_rank_a_reduce_ahead_runs_it_again_with_the_ranks_behind(tmp_path: Path) -> None:
    """The root enters the reduce (seq 3) a second late; rank 1, a leaf, hands over its part
    meanwhile, goes on to the all_reduce and cuts its link to the root there. The root and
    rank 2 are behind in the reduce, whose result differs by rank: rank 1 runs seq 3 again
    with them from the input it kept, then all re-run seq 4. Every result is exact."""
    count, calls = 4096, ("sum", "sum", "reduce", "sum")
    fault = "sleep:rank=0:seq=3:secs=1;link:rank=1:seq=4:peer=0"
    env = _env(tmp_path, fault, calls=",".join(calls)) | {"ITERS": "1", "COUNT": str(count)}
    out = subprocess.run(_cmd(), env=env, capture_output=True, text=True, timeout=80)
    assert out.returncode == 0, out.stdout + out.stderr
    xs = [rank_input(r, count) for r in range(WORLD)]
    total = _digest(np.sum([x.astype(np.float64) for x in xs], axis=0))
    for rank in range(WORLD):
        lines = _lines(out.stdout, rank)
        results = [ln.split()[1:] for ln in lines if ln.startswith("result ")]
        shown = [c for c in calls if c != "reduce" or rank == 0]
        assert results == [["0", call, total] for call in shown], lines
    doc = json.loads((tmp_path / f"cclctl-{JOB}-rank1.json").read_text())
    runs = [(r["seq"], r["attempt"], r["epoch"], r["state"]) for r in doc["records"]]
    assert runs[2:] == [
        (3, 1, 0, "completed"), (4, 1, 0, "failed"), (3, 2, 1, "completed"), (4, 2, 1, "completed")
    ], runs  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_cut_link_in_a_send_fails_the_ranks_in_an_all_reduce_at_once(tmp_path: Path) -> None:
    """Rank 0's send to rank 1 loses its link while rank 2, which makes no point-to-point
    call, goes on to the next all_reduce: the ranks of the pair fail with the link's error
    and refuse the retry, so rank 2's retry fails naming them, not at the budget."""
    hold = tmp_path / "release"
    env = _env(tmp_path, "link:rank=0:seq=1:peer=1", calls="pair,sum") | {"HOLD": str(hold)}
    env["CCLCTL_RETRY_BUDGET"] = "60"  # far past the test's wait: only a refusal ends it sooner
    failed = _failures(subprocess.Popen(
        _cmd(), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ), hold)  # fmt: skip
    for rank in (0, 1):
        assert failed[rank].startswith("failed 0 pair "), failed
        assert "link between rank 0 and rank 1" in failed[rank], failed
    assert failed[2].startswith("failed 0 sum "), failed
    assert "rank(s) 0-1 were in recv, send, which is not re-run" in failed[2], failed


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_rank_that_closes_after_a_link_fault_tells_the_retry_at_once(tmp_path: Path) -> None:
    """The link between ranks 0 and 1 is cut in an all_reduce rank 2 never enters: rank 2
    hears of the fault between calls and closes. Its close writes its refusal, so the
    others' retry fails at once, naming it, instead of waiting for it until the budget."""
    hold = tmp_path / "release"
    env = _env(tmp_path, "link:rank=0:seq=1:peer=1", calls="leave") | {"HOLD": str(hold)}
    env["CCLCTL_RETRY_BUDGET"] = "60"  # far past the test's wait: only a refusal ends it sooner
    proc = subprocess.Popen(
        _cmd(), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen: dict[int, str] = {}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            rank, _, text = line.partition("] ")
            if text.startswith(("failed ", "left")):
                seen[int(rank.rpartition(" ")[2])] = text.strip()
            if len(seen) == WORLD:
                break
    finally:
        hold.touch()
        proc.wait(timeout=60)
    assert seen.get(2) == "left", seen
    for r in (0, 1):
        assert seen[r].startswith("failed 0 leave "), seen
        assert "rank(s) 2 were in close, which is not re-run" in seen[r], seen


def _failures(proc: subprocess.Popen[str], hold: Path) -> dict[int, str]:
    """Each rank's ``failed ...`` line, once every rank has printed one; then the ranks are
    let go (``HOLD``) and the job must fail."""
    failed: dict[int, str] = {}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            rank, _, text = line.partition("] ")
            if text.startswith("failed "):
                failed[int(rank.rpartition(" ")[2])] = text.strip()
            if len(failed) == WORLD:
                break
    finally:
        hold.touch()
        assert proc.wait(timeout=60) != 0
    assert sorted(failed) == list(range(WORLD)), failed
    return failed


def test_a_call_that_is_not_rerun_tells_the_agreement_at_once(server: StoreServer) -> None:
    """A rank whose send a link fault failed writes its refusal to the next
    epoch's agreement and raises the fault's own error: the ranks in a re-run call a call
    apart find it there and fail at once, naming the call (the plan's rules, below)."""
    retry = Retry(
        RuntimeConfig(), job=JOB, store=server.address, token="", store_host=server.host,
        telemetry=None,
    )  # fmt: skip
    fault = CommError("link between rank 0 and rank 1 broke")
    fault.revocation = Revocation(kind="link", origin=0, reason="peer closed", seen_by=1)

    def cut(call: Call) -> None:
        raise fault

    port = SimpleNamespace(
        id="0:0-2", rank=1, cfg=RuntimeConfig(retry_budget_s=20), attempt=cut,
        failure=SimpleNamespace(epoch=3), completed=6, kept=_kept_at(5),
    )  # fmt: skip
    with pytest.raises(CommError) as raised:
        Retrying(port, retry).not_rerun(Call.send(np.zeros(1), 0))  # type: ignore[arg-type]
    assert raised.value is fault
    with StoreClient(server.host, server.port) as client:
        entry = ScopedStore.for_job(client, JOB).try_get("retry/0:0-2/4/in/1")
    assert entry is not None
    ask = Ask(**json.loads(entry))
    assert (ask.call, ask.pending, ask.kept) == ("send", 7, 5)
    entries = {0: _ask("all_reduce", 8, 7), 1: ask, 2: _ask("all_reduce", 8, 7)}
    with pytest.raises(CommError, match=r"rank\(s\) 1 were in send, which is not re-run"):
        decide(0, entries)


def _kept_at(seq: int) -> Kept:
    kept = Kept()
    kept.keep(seq, np.zeros(1))
    return kept


def _ask(call: str, pending: int, kept: int = 0, ops: str = "") -> Ask:
    """An entry at ``pending`` that keeps seq ``kept`` (as ``call``), or the seqs up to it
    that ``ops`` names (oldest first)."""
    ops = ops or (call if kept else "")
    n = len(ops.split(",")) if ops else 0
    return Ask(call, pending, kept, 2, 0.0, kept - n + 1 if n else 0, ops)


def test_ranks_at_one_seq_rerun_it_whatever_the_call() -> None:
    for call in RERUNS:
        assert decide(0, {r: _ask(call, 4, 3) for r in range(3)}) == Plan(4)


def test_ranks_ahead_of_a_call_whose_result_differs_by_rank_run_it_again() -> None:
    """The ranks behind are in a reduce (its result differs by rank): the ranks ahead, which
    kept its input, run it again with them, then re-run their own call."""
    for call in ("reduce_scatter", "reduce", "all_to_all", "all_to_allv"):
        ahead = _ask("all_reduce", 5, 4, ops=f"all_reduce,{call}")
        entries = {0: _ask(call, 4, 3), 1: ahead, 2: _ask(call, 4, 3)}
        assert decide(2, entries) == Plan(4, (REPLAY,))


def test_ranks_one_call_apart_are_caught_up_from_the_lowest_rank_ahead() -> None:
    ahead = _ask("barrier", 5, 4, ops="all_gather")
    entries = {0: _ask("all_gather", 4, 3), 1: ahead, 2: ahead}
    assert decide(0, entries) == Plan(4, (1,))


def test_what_cannot_be_made_exact_is_refused_naming_why() -> None:
    with pytest.raises(CommError, match=r"rank\(s\) 1 were in recv, which is not re-run"):
        decide(0, {0: _ask("all_reduce", 4), 1: _ask("recv", 4)})
    with pytest.raises(CommError, match="at seq 4 were in different calls"):
        decide(0, {0: _ask("all_reduce", 4), 1: _ask("all_gather", 4)})
    with pytest.raises(CommError, match="stopped at seqs 3 to 5"):
        decide(0, {0: _ask("all_reduce", 3), 1: _ask("all_reduce", 5, 4)})
    with pytest.raises(CommError, match="stopped at seqs 4 to 5"):  # the rank ahead kept seq 3
        decide(0, {0: _ask("all_gather", 4), 1: _ask("all_gather", 5, 3)})


def test_a_rank_ahead_runs_the_call_whose_result_differs_by_rank_again_from_its_input() -> None:
    """The replay plan: a rank that completed seq 4 (a reduce) runs it again from the copy
    of its input it kept, into a scratch result, then re-runs its own seq 5; a rank behind
    only re-runs seq 4. Its kept input is the input as it was before the call wrote it."""
    replayed: list[np.ndarray] = []
    kept = Kept()
    given = np.arange(4.0)
    kept.keep_input(4, given, lambda src: replayed.append(src.copy()))
    given[...] = -1  # the call wrote over its input (in place): the kept copy is apart
    rewound: list[tuple[int, int]] = []

    def rewind(seq: int, attempt: int) -> None:
        rewound.append((seq, attempt))

    for pending, runs_again in ((5, 1), (4, 0)):
        replayed.clear()

        def retrier(comm: object, ask: Ask) -> Plan:
            return Plan(4, (REPLAY,))

        port = SimpleNamespace(completed=pending - 1, rewind=rewind, kept=kept, rank=0)
        cut = CommError("cut")
        retrying = Retrying(port, retrier)  # type: ignore[arg-type]
        answered, attempt = retrying.recover("all_reduce", pending, cut, 2, 1e18, given)
        assert (answered, attempt) == (False, 2)
        assert len(replayed) == runs_again
        if runs_again:
            assert replayed[0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert rewound == [(4, 2), (4, 2)]


@pytest.mark.timeout(30)
def test_a_retry_stops_waiting_once_the_job_failed_otherwise(server: StoreServer) -> None:
    """A rank that took a peer's teardown for a link fault waits in the agreement for ranks
    that failed on a hang and will never join: the job's record says so, and it raises
    that failure (naming its origin) at once instead of at the budget."""
    retry = Retry(
        RuntimeConfig(), job=JOB, store=server.address, token="", store_host=server.host,
        telemetry=None,
    )  # fmt: skip
    hang = Revocation(
        kind="hang", origin=2, reason="is stopped (process state T)", comm="0:0-2", seq=7,
        op="all_reduce", seen_by=1, via="watchdog",
    )  # fmt: skip
    with StoreClient(server.host, server.port) as client:
        ScopedStore.for_job(client, JOB).set(revocation.KEY, hang.encode())
    failure = FailureState(rank=0, comm="0:0-2")
    closed = SimpleNamespace(close=lambda: None)  # the transport the retry closes first
    comm = SimpleNamespace(id="0:0-2", rank=0, world_size=3, failure=failure, transport=closed)
    ask = Ask("all_reduce", 7, 6, attempt=2, deadline=time.monotonic() + 600)  # past the test's
    with pytest.raises(CommError) as raised:
        retry(comm, ask)  # type: ignore[arg-type]
    assert raised.value.revocation == hang
    assert "rank 2" in str(raised.value) and "stopped" in str(raised.value), raised.value


def test_a_failure_the_retry_does_not_recover_from_is_raised_as_it_is() -> None:
    """The recovery step hands on an error that names another failure of the job (not a
    retried one) as it is, not as this rank's link fault that the retries gave up on."""
    hang = Revocation(kind="hang", origin=2, reason="is stuck", comm="0:0-2", seen_by=1)
    job_failed = CommError("rank 0: retry of all_reduce seq 7: revoked: rank 2 is stuck")
    job_failed.revocation = hang

    def retrier(comm: object, ask: Ask) -> Plan:
        raise job_failed

    port = SimpleNamespace(completed=6, kept=Kept(), rank=0, cfg=RuntimeConfig(retry_budget_s=20))
    retrying = Retrying(port, retrier)  # type: ignore[arg-type]
    with pytest.raises(CommError) as raised:
        retrying.recover("all_reduce", 7, CommError("link broke"), 2, 1e18, np.zeros(1))
    assert raised.value is job_failed


def _overlapping() -> tuple[np.ndarray, str, np.ndarray]:
    a = np.ones(4, np.float32)
    return a[:3], "sum", a[1:]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (lambda: ([1, 2],), "all_reduce: buf must be a numpy array, got list"),
        (lambda: (np.ones((4, 4), np.float32)[:, 1],), "all_reduce: buf is not contiguous"),
        (lambda: (np.ones(3, np.complex64),), "all_reduce: buf has dtype complex64"),
        (lambda: (np.ones(3, np.float32), "mean"), "all_reduce: unknown reduction 'mean'"),
        (
            lambda: (np.ones(3, np.float32), "sum", np.ones(4, np.float32)),
            "all_reduce: out has 4 elements, expected 3",
        ),
        (_overlapping, "all_reduce: out partially overlaps buf"),
    ],
)
def test_a_retried_all_reduce_checks_its_arguments_as_one_without_retry(
    args: Callable[[], tuple[Any, ...]], message: str
) -> None:
    """With retry on, an all_reduce's arguments are checked once, before its input is
    saved, and refused with the error the call gives with retry off; a good call's result is
    exact, its attempt running on the checked views."""

    def body(comm):  # type: ignore[no-untyped-def]
        retrying = Retrying(comm, lambda port, ask: Plan(1))  # no fault: never asked
        with pytest.raises(InvalidArgument) as info:
            retrying.run(Call.all_reduce(*args()))
        x = np.arange(4, dtype=np.float32)
        got = retrying.run(Call.all_reduce(x))
        assert np.shares_memory(got, x) and got.tolist() == [0.0, 1.0, 2.0, 3.0]
        assert comm.kept.seq == comm.completed == 1  # kept for ranks behind, as ever
        return str(info.value)

    assert run_ranks(1, body)[0].startswith(message)
