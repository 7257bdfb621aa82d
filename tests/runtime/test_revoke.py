"""A failure is one event: every surviving rank's error names the same origin.

Real jobs started from the environment (rank 0 hosts the store), on shared memory and on
TCP, at 4 and 8 ranks: a killed rank, a stopped one (the watchdog expires the hang), a cut
link, a mismatched collective and an operator's abort through the store. Before the revoke
record, most survivors blamed a neighbour ("rank 1 failed").
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fault_job import TOKEN, FaultJob
from telemetry_helpers import wait_for

from cclctl import revocation
from cclctl.live import snapshot
from cclctl.revocation import OPERATOR, Revocation
from cclctl.store.client import StoreClient
from cclctl.store.scope import ScopedStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

TRANSPORTS = ["auto", "tcp"]  # auto: one host, so shared memory


def env_job(
    tmp: Path,
    n: int,
    fault: str,
    transport: str,
    timeout_s: float = 2.0,
    op: str = "all_reduce",
    **extra: str,
) -> FaultJob:
    """Ranks started from the environment, rank 0 hosting the store, each exiting after
    its first error: the job's watchdog raises (the default policy), dumps go to the
    job's folder under ``tmp``."""
    env = {
        "CCLCTL_ON_HANG": "raise",
        "CCLCTL_TRANSPORT": transport,
        "CCLCTL_RETRY_BUDGET": "0",  # the raise path: a cut link is not retried
        **extra,
    }
    return FaultJob(
        tmp, n, fault=fault, op=op, timeout_s=timeout_s, job="envjob", pause_s=0.2,
        hold_on_error=extra.get("HOLD_ON_ERROR") == "1", rank0_hosts=True,
        default_dumps=True, extra=env,
    )  # fmt: skip


def _survivors(job: FaultJob, culprit: int | None) -> dict[int, str]:
    return job.errors([r for r in range(job.n) if r != culprit])


def _verdicts(job: FaultJob, tmp: Path) -> list[tuple[str, str]]:
    """The first verdict (kind, suspects) of the live diagnosis against the job's store,
    which outlives rank 0, and of the post-mortem with no argument (the newest job's dumps
    in the default folder under ``tmp``)."""
    env = {**os.environ, "TMPDIR": str(tmp)}
    env.pop("CCLCTL_STORE", None)
    found = []
    for ask in (["--store", job.store, "--job", job.job], []):
        said = subprocess.run(
            [sys.executable, "-m", "cclctl", "diagnose", "hang", *ask, "--json"],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert said.returncode == 3, said.stderr
        first = json.loads(said.stdout)["verdicts"][0]
        found.append((first["kind"], first["suspects"]))
    return found


def _assert_all_name(errors: dict[int, str], pattern: str) -> None:
    wrong = {r: e for r, e in errors.items() if not re.search(pattern, e)}
    assert not wrong, f"ranks not naming the origin ({pattern!r}): {wrong}"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("n", [4, 8])
def test_a_killed_rank_is_named_dead_by_every_survivor(
    tmp_path: Path, transport: str, n: int
) -> None:
    culprit = n - 2
    job = env_job(tmp_path, n, f"kill:rank={culprit}:seq=3", transport)
    try:
        errors = _survivors(job, culprit)
    finally:
        job.finish()
    # in seq 3, or refusing the next call if the record came while it was between calls
    _assert_all_name(errors, rf"seq 3[ :].*rank {culprit} \(pid \d+ on [^)]+\) died \(")
    assert _verdicts(job, tmp_path) == [("dead", str(culprit))] * 2


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("n", [4, 8])
def test_a_stopped_rank_is_named_by_every_survivor_once_the_watchdog_expires(
    tmp_path: Path, transport: str, n: int
) -> None:
    culprit = n - 3
    job = env_job(tmp_path, n, f"stop:rank={culprit}:seq=3", transport)
    try:
        errors = _survivors(job, culprit)
    finally:
        job.finish()
    _assert_all_name(errors, rf"rank {culprit} \(pid \d+ on [^)]+\) is stopped")
    live, post = _verdicts(job, tmp_path)
    assert live == ("stopped", str(culprit))  # the process table shows it stopped
    assert post in {("stopped", str(culprit)), ("not_entered", str(culprit))}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_cut_link_is_named_by_every_rank(tmp_path: Path, transport: str) -> None:
    job = env_job(tmp_path, 4, "link:rank=1:seq=3:peer=2", transport)
    try:
        errors = _survivors(job, None)
    finally:
        job.finish()
    _assert_all_name(errors, r"link between rank 1 and rank 2 broke")
    assert _verdicts(job, tmp_path) == [("link", "1-2")] * 2


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("fault", ["op:rank=2:seq=3:to=broadcast", "count:rank=2:seq=3:to=7"])
def test_the_odd_one_out_of_a_mismatch_is_named_by_every_rank(
    tmp_path: Path, transport: str, fault: str
) -> None:
    job = env_job(tmp_path, 4, fault, transport)
    try:
        errors = _survivors(job, None)
    finally:
        job.finish()
    _assert_all_name(errors, r"rank 2 \(pid \d+ on [^)]+\) called (broadcast|all_reduce)\(")
    assert _verdicts(job, tmp_path) == [("mismatch", "2")] * 2


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_broadcast_leaf_with_another_count_names_itself(tmp_path: Path, transport: str) -> None:
    """Only the leaf sees the mismatch (the others finish their broadcasts without it), so
    two views tie; the ranks that completed the seq outvote it: the leaf names itself."""
    job = env_job(tmp_path, 4, "count:rank=3:seq=3:to=7", transport, op="broadcast")
    try:
        errors = job.errors([3])
    finally:
        job.finish()
    _assert_all_name(
        errors, r"rank 3 \(pid \d+ on [^)]+\) called broadcast\(float32, root 0, count 7\)"
    )


def _blocked_in(scoped: ScopedStore, rank: int) -> int | None:
    """The seq ``rank``'s status (its own, or its host agent's) says it is blocked in."""
    snap = snapshot.fetch(scoped.client, "envjob").statuses.get(rank)
    return None if snap is None or snap.inflight is None else snap.inflight.seq


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_operators_abort_reaches_every_rank_even_behind_a_stopped_peer(
    tmp_path: Path, transport: str
) -> None:
    """Rank 3 is frozen, so the others hang in seq 3 (a long timeout: the watchdog stays
    quiet); the operator's record in the store ends every live rank's call."""
    job = env_job(tmp_path, 4, "stop:rank=3:seq=3", transport, timeout_s=60)
    try:  # the store outlives rank 0, which exits after its error like the others
        with StoreClient.from_address(job.store, token=TOKEN, connect_timeout_s=30) as client:
            scoped = ScopedStore.for_job(client, job.job)
            wait_for(lambda: _blocked_in(scoped, 0) == 3, timeout_s=30)
            rec = Revocation("aborted", OPERATOR, "maintenance", by="sre@vm", via="operator")
            assert scoped.compare_set(revocation.KEY, None, rec.encode()) == rec.encode()
            acked = lambda: [r for r in range(4) if scoped.try_get(revocation.ack_key(r))]  # noqa: E731
            try:
                wait_for(lambda: acked() == [0, 1, 2], timeout_s=10)  # the frozen rank 3 cannot
            except AssertionError:
                raise AssertionError(f"acks: {acked()}; errors: {_survivors(job, 3)}") from None
            errors = _survivors(job, 3)
            assert scoped.try_get(revocation.ack_key(3)) is None
    finally:
        job.finish()
    _assert_all_name(errors, r"seq 3 aborted by operator sre@vm: maintenance")
