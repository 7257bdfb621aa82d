"""Shrinking away a rank that died or froze: the survivors go on with exact results.

Real jobs on shared memory and on TCP: a rank SIGKILLed from outside in the middle of a
loop of all_reduces (``CCLCTL_ON_FAILURE=shrink``: the interrupted call re-runs by itself),
an explicit ``comm.shrink()`` after a revoked call, a stopped rank left out at the
agreement's deadline, and a hang in the shrunk communicator, which every status, dump and
verdict names by the job's rank. Every rank contributes ``(rank + 1) * (i + 1)`` to
iteration ``i``, so a result says exactly which ranks it summed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fault_job import TOKEN
from shrink_job import ShrinkJob, contribution

from cclctl.live.snapshot import JobStatuses, fetch
from cclctl.store.client import StoreClient
from cclctl.store.scope import ScopedStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

TRANSPORTS = ["auto", "tcp"]  # auto: one host, so shared memory


def _assert_exact(
    docs: dict[int, dict[str, object]], world: list[int], dead: int, iters: int
) -> None:
    """Every survivor has the same result for every iteration: the whole world's sum up to
    the failure, the survivors' after it, and ends in the survivors' communicator."""
    survivors = [r for r in world if r != dead]
    full, shrunk = contribution(world), contribution(survivors)
    runs = {rank: doc["results"] for rank, doc in docs.items()}
    first = runs[survivors[0]]
    assert all(run == first for run in runs.values()), runs
    assert isinstance(first, list) and len(first) == iters
    per = [value // (i + 1) for i, value in enumerate(first)]
    assert all(value == (i + 1) * p for i, (value, p) in enumerate(zip(first, per, strict=True)))
    switch = per.index(shrunk)
    assert per == [full] * switch + [shrunk] * (iters - switch), per
    for rank, doc in docs.items():
        assert doc["members"] == survivors
        assert doc["comm"] == f"1:{_folded(survivors)}"
        assert doc["new_rank"] == survivors.index(rank)
        assert doc["shrinks"] == [[dead]]


def _folded(ranks: list[int]) -> str:
    from cclctl.ranges import fold_ranks

    return fold_ranks(ranks)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigkill_of_one_of_eight_ranks_the_seven_survivors_continue_exactly(
    tmp_path: Path, transport: str
) -> None:
    iters, dead = 16, 6
    job = ShrinkJob(
        tmp_path, 8, iters=iters, COUNT="65536", CCLCTL_ON_FAILURE="shrink",
        CCLCTL_TRANSPORT=transport,
    )  # fmt: skip
    try:
        job.wait_line(dead, "iter 3 ")
        job.kill(dead)  # mid-loop: between calls or inside one
        docs = job.outcome([r for r in range(8) if r != dead])
    finally:
        job.finish()
    _assert_exact(docs, list(range(8)), dead, iters)
    assert docs[0]["results"][3] == 4 * contribution(list(range(8)))  # it printed iter 3


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_explicit_shrink_after_a_revoked_call(tmp_path: Path, transport: str) -> None:
    """With the default policy the survivors' call raises (revoked, naming the dead rank);
    each calls ``comm.shrink()`` and redoes the iteration on the communicator it returns."""
    iters, dead = 8, 2
    job = ShrinkJob(
        tmp_path, 4, iters=iters, SHRINK="explicit", CCLCTL_TRANSPORT=transport,
        CCLCTL_FAULT=f"kill:rank={dead}:seq=4:comm=0:0-3",
    )  # fmt: skip
    try:
        docs = job.outcome([0, 1, 3])
    finally:
        job.finish()
    for doc in docs.values():
        doc["shrinks"] = [[dead]]  # explicit: no callback; the members say who left
    _assert_exact(docs, [0, 1, 2, 3], dead, iters)
    assert docs[0]["results"][:3] == [(i + 1) * 10 for i in range(3)]
    for rank in (0, 1, 3):
        assert re.search(
            rf"rank {rank} revoked: .*rank 2 \(pid \d+ on [^)]+\) died", job.stderr[rank]
        )


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stopped_rank_is_left_out_at_the_deadline(tmp_path: Path, transport: str) -> None:
    """Rank 2 freezes (SIGSTOP) in seq 3: the watchdog expires the survivors' calls, they
    shrink without it once the agreement's deadline passes, and finish on the rest."""
    iters, frozen = 6, 2
    job = ShrinkJob(
        tmp_path, 4, iters=iters, SHRINK="explicit", CCLCTL_TRANSPORT=transport,
        CCLCTL_TIMEOUT="2", CCLCTL_ON_HANG="raise",
        CCLCTL_FAULT=f"stop:rank={frozen}:seq=3:comm=0:0-3",
    )  # fmt: skip
    try:
        docs = job.outcome([0, 1, 3])
        with StoreClient.from_address(job.store, token=TOKEN) as client:
            decided = ScopedStore.for_job(client, job.job).try_get("shrink/1/members")
        assert job.procs[frozen].poll() is None  # still there, frozen: never waited on
    finally:
        job.kill(frozen, signal.SIGKILL)
        job.finish()
    for doc in docs.values():
        doc["shrinks"] = [[frozen]]
    _assert_exact(docs, [0, 1, 2, 3], frozen, iters)
    assert decided is not None
    assert [e["rank"] for e in json.loads(decided)["entries"]] == [0, 1, 3]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_operators_abort_reaches_every_survivor_of_a_shrink(
    tmp_path: Path, transport: str
) -> None:
    """Rank 3 dies, the survivors shrink and go on; the job's revoke record then holds
    nothing of the failure they got past, so `cclctl abort` is written and every survivor
    raises it, naming the operator (the shrunk communicator's failures go through the
    store as the world's did)."""
    dead = 3
    job = ShrinkJob(
        tmp_path, 4, iters=400, PAUSE="0.05", CCLCTL_ON_FAILURE="shrink",
        CCLCTL_TRANSPORT=transport,
    )  # fmt: skip
    try:
        job.wait_line(dead, "iter 2 ")
        job.kill(dead)
        for rank in (0, 1, 2):
            job.wait_line(rank, "world 3 ")  # running on the shrunk communicator
        env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
        abort = subprocess.run(
            [sys.executable, "-m", "cclctl", "abort", "--store", job.store, "--job", job.job,
             "--reason", "drain", "--wait", "20"],
            env=env | {"CCLCTL_TOKEN": TOKEN}, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        errors = {}
        for rank in (0, 1, 2):
            proc = job.procs[rank]
            _, err = proc.communicate(timeout=60)
            errors[rank] = err.decode(errors="replace")
            assert proc.returncode != 0, errors[rank]
    finally:
        job.finish()
    assert abort.returncode == 0, abort.stdout + abort.stderr
    assert "rank 3 (pid" in abort.stdout and "dead" in abort.stdout, abort.stdout
    for rank, err in errors.items():
        # the rank's uncaught error is its one line; its exit dump names the error's kind
        assert re.search(r"aborted by operator .*drain", err), (rank, err)
        # the call aborted is the shrunk communicator's, as the rank's exit dump says: one
        # in flight there failed with the abort, or the next one there was refused
        doc = json.loads((job.out / f"cclctl-{job.job}-rank{rank}.json").read_text())
        assert doc["reason"].startswith("uncaught CollectiveAborted: "), (rank, doc["reason"])
        in_flight = [
            r for r in doc["records"]
            if r["comm"] == "1:0-2" and "aborted by operator" in (r.get("error") or "")
        ]  # fmt: skip
        refused = "on communicator 1:0-2 refused: aborted by operator" in doc["reason"]
        assert in_flight or refused, (rank, doc["reason"], doc["records"][-3:])


#: Seconds in a call that make it hung, for the diagnoses of the hang after a shrink.
STUCK_AFTER = 1
#: The hang after a shrink: rank 1 dies in the world's seq 3, the survivors shrink to
#: SHRUNK, where SKIPPER (its rank 3) never enters seq 6.
SHRUNK, SKIPPER = "1:0,2-5", 4


def _skip_after_shrink(tmp: Path, transport: str, **env: str) -> ShrinkJob:
    return ShrinkJob(
        tmp, 6, iters=12, CCLCTL_ON_FAILURE="shrink", CCLCTL_TRANSPORT=transport,
        CCLCTL_FAULT=f"kill:rank=1:seq=3:comm=0:0-5;skip:rank={SKIPPER}:seq=6:comm={SHRUNK}",
        **env,
    )  # fmt: skip


def _hung_after_shrink(job: ShrinkJob, comm: str, skipper: int) -> JobStatuses:
    """The job's statuses once every survivor but ``skipper`` has waited inside seq 6 of
    ``comm`` on a peer for longer than :data:`STUCK_AFTER` by its own clock (each status is
    an event: the loop ends at the first that shows it; pytest-timeout bounds a job that
    never gets there)."""
    with StoreClient.from_address(job.store, token=TOKEN) as client:
        while True:
            seen = fetch(client, job.job)
            waiting = {
                rank: snap.inflight
                for rank, snap in seen.statuses.items()
                if snap.inflight is not None and snap.inflight.comm == comm
                and snap.inflight.seq == 6 and snap.inflight.waiting_on is not None
                and snap.time_ns - snap.inflight.start_ns > 1.5 * STUCK_AFTER * 1e9
            }  # fmt: skip
            if set(waiting) == {0, 2, 3, 5} and seen.statuses[skipper].inflight is None:
                return seen


def _diagnosis(*where: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    said = subprocess.run(
        [sys.executable, "-m", "cclctl", "diagnose", "hang", *where, "--json",
         "--stuck-after", str(STUCK_AFTER)],
        env=env | {"CCLCTL_TOKEN": TOKEN}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert said.returncode == 3, said.stdout + said.stderr
    doc: dict[str, object] = json.loads(said.stdout)
    return doc


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_hang_after_a_shrink_is_named_by_the_jobs_rank(tmp_path: Path, transport: str) -> None:
    """Rank 1 dies and the survivors shrink to ``1:0,2-5``, where rank 4 (the shrunk
    communicator's rank 3) never enters seq 6. The ranks waiting on it say rank 4 in their
    statuses and dumps, and the diagnosis, live and post-mortem, names rank 4 first, then
    rank 1's death (the record the survivors keep) as shrunk away."""
    comm, skipper = SHRUNK, SKIPPER
    job = _skip_after_shrink(tmp_path, transport, CCLCTL_ON_HANG="wait")
    try:
        seen = _hung_after_shrink(job, comm, skipper)
        live = _diagnosis("--store", job.store, "--job", job.job)
        for rank in (0, 2, 3, 4, 5):
            job.kill(rank, signal.SIGTERM)  # each dumps on its way out
        for rank in (0, 2, 3, 4, 5):
            job.procs[rank].wait(30)
        post = _diagnosis(str(job.out))
    finally:
        job.finish()
    waits_on = {r: seen.statuses[r].inflight.waiting_on for r in (0, 2, 3, 5)}  # type: ignore[union-attr]
    for rank in waits_on:  # every chain of waits, in the job's ranks, ends at rank 4
        chain = [rank]
        while chain[-1] != skipper and len(chain) <= len(waits_on):
            chain.append(waits_on.get(chain[-1], -1))  # type: ignore[arg-type]
        assert chain[-1] == skipper, (chain, waits_on)
    for rank in waits_on:  # rank 1's death, as history: its comm is the one shrunk past
        past = seen.statuses[rank].revoke
        assert past is not None and (past.kind, past.origin, past.comm) == ("died", 1, "0:0-5")
    for doc in (live, post):
        first, second = doc["verdicts"][:2]  # type: ignore[index]
        assert (first["kind"], first["suspects"], first["comm"], first["seq"]) == (
            "not_entered", str(skipper), comm, 6,
        ), first  # fmt: skip
        waits = f"wait on rank {skipper} in all_reduce seq 6 of comm {comm}"
        assert any(waits in line for line in first["evidence"]), first["evidence"]
        assert (second["kind"], second["suspects"], second["shrunk_away"]) == ("dead", "1", comm)
        assert "nothing to restart" in second["next_step"], second


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_hang_after_a_shrink_is_every_survivors_error_naming_the_rank(
    tmp_path: Path, transport: str
) -> None:
    """The same hang under the default policy: the first watchdog to expire a call asks
    the live diagnosis, as in the world's communicator, and every survivor raises naming
    rank 4, not the neighbour it waited on."""
    skipper = SKIPPER
    job = _skip_after_shrink(tmp_path, transport, CCLCTL_TIMEOUT="3")
    errors = {}
    try:
        for rank in (0, 2, 3, 5):
            _, err = job.procs[rank].communicate(timeout=60)
            errors[rank] = err.decode(errors="replace")
            assert job.procs[rank].returncode != 0, errors[rank]
    finally:
        job.finish()
    origin = rf"rank {skipper} \(pid \d+ on [^)]+\) has not entered all_reduce seq 6"
    wrong = {r: e[-600:] for r, e in errors.items() if not re.search(origin, e)}
    assert not wrong, wrong


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_second_death_shrinks_the_shrunk_communicator_again(
    tmp_path: Path, transport: str
) -> None:
    """Rank 1 dies in the world's seq 3, rank 4 (the shrunk communicator's rank 3, named
    by its job rank in the plan) in seq 6 of ``1:0,2-5``: the four left end in
    ``2:0,2-3,5`` with every iteration exact, and each was told of both shrinks."""
    iters, first, second = 10, 1, 4
    job = ShrinkJob(
        tmp_path, 6, iters=iters, CCLCTL_ON_FAILURE="shrink", CCLCTL_TRANSPORT=transport,
        CCLCTL_FAULT=f"kill:rank={first}:seq=3:comm=0:0-5;kill:rank={second}:seq=6:comm=1:0,2-5",
    )  # fmt: skip
    try:
        docs = job.outcome([0, 2, 3, 5])
    finally:
        job.finish()
    world = list(range(6))
    once = [r for r in world if r != first]
    twice = [r for r in once if r != second]
    sums = [contribution(world)] * 2 + [contribution(once)] * 5 + [contribution(twice)] * 3
    for doc in docs.values():
        assert doc["results"] == [(i + 1) * s for i, s in enumerate(sums)], doc["results"]
        assert (doc["comm"], doc["members"]) == ("2:0,2-3,5", twice)
        assert doc["shrinks"] == [[first], [second]]
