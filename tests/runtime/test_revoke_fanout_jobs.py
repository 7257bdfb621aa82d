"""The revoke record through the host agent, in real jobs: an operator's abort reaches
every live rank through its agent, whose one wait is the store's only one on the record,
and still does once the agent is killed (each live rank waits on the store itself again).
Ranks started from the environment, the store in this process (its waits are counted), the
host agent on (a job's default); rank 3 is frozen, so the others hang in seq 3 under a long
watchdog timeout until the record ends their calls.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
from fault_job import TOKEN, FaultJob
from telemetry_helpers import wait_for

from cclctl import revocation
from cclctl.live import snapshot
from cclctl.revocation import OPERATOR, Revocation
from cclctl.store.client import StoreClient
from cclctl.store.scope import ScopedStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _job(tmp: Path) -> FaultJob:
    env = {"CCLCTL_ON_HANG": "raise", "CCLCTL_TRANSPORT": "auto", "CCLCTL_RETRY_BUDGET": "0"}
    return FaultJob(
        tmp, 4, fault="stop:rank=3:seq=3", op="all_reduce", timeout_s=60, job="fanjob",
        pause_s=0.2, hold_on_error=False, default_dumps=True, extra=env,
    )  # fmt: skip


def _blocked_in(scoped: ScopedStore, rank: int) -> int | None:
    snap = snapshot.fetch(scoped.client, "fanjob").statuses.get(rank)
    return None if snap is None or snap.inflight is None else snap.inflight.seq


@pytest.mark.parametrize("kill_agent", [False, True], ids=["agent", "agent-killed"])
def test_an_abort_reaches_every_live_rank_with_or_without_its_agent(
    tmp_path: Path, kill_agent: bool
) -> None:
    job = _job(tmp_path)
    try:
        with StoreClient.from_address(job.store, token=TOKEN, connect_timeout_s=30) as client:
            scoped = ScopedStore.for_job(client, job.job)
            wait_for(lambda: all(_blocked_in(scoped, r) == 3 for r in (0, 1, 2)), timeout_s=30)
            (doc,) = snapshot.fetch(client, job.job).hosts.values()
            assert job.server is not None
            waits = lambda: job.server.state.waiting(b"cclctl/fanjob/revoke")  # noqa: E731
            wait_for(lambda: waits() == 1, timeout_s=30)  # the agent's, for the host's 4 ranks
            if kill_agent:
                os.kill(doc.pid, signal.SIGKILL)
                wait_for(lambda: not Path(f"/proc/{doc.pid}").exists(), timeout_s=10)
                wait_for(lambda: waits() == 3, timeout_s=30)  # the live ranks' own (3 is frozen)
            rec = Revocation("aborted", OPERATOR, "maintenance", by="sre@vm", via="operator")
            assert scoped.compare_set(revocation.KEY, None, rec.encode()) == rec.encode()
            acked = lambda: [r for r in range(4) if scoped.try_get(revocation.ack_key(r))]  # noqa: E731
            wait_for(lambda: acked() == [0, 1, 2], timeout_s=20)
            errors = job.errors([0, 1, 2])
    finally:
        job.finish()
    wrong = {
        r: e for r, e in errors.items() if not re.search(r"seq 3 aborted by operator sre@vm", e)
    }
    assert not wrong, f"ranks not naming the origin: {wrong}"


def test_a_hang_is_diagnosed_once_and_every_survivor_names_its_origin(tmp_path: Path) -> None:
    """Rank 5 is frozen at seq 3; the other seven expire the call within a status interval
    of each other: one claims the hang and diagnoses it (one claim, one "done" in the
    store), every one names rank 5."""
    env = {"CCLCTL_ON_HANG": "raise", "CCLCTL_TRANSPORT": "auto", "CCLCTL_RETRY_BUDGET": "0"}
    job = FaultJob(
        tmp_path, 8, fault="stop:rank=5:seq=3", op="all_reduce", timeout_s=2.0, job="fanjob",
        pause_s=0.2, hold_on_error=False, default_dumps=True, extra=env,
    )  # fmt: skip
    survivors = [r for r in range(8) if r != 5]
    try:
        errors = job.errors(survivors)
        with StoreClient.from_address(job.store, token=TOKEN, connect_timeout_s=30) as client:
            claims = ScopedStore.for_job(client, job.job).list("diagnosis/")
    finally:
        job.finish()
    wrong = {r: e for r, e in errors.items() if not re.search(r"rank 5 \(pid \d+ on [^)]+\)", e)}
    assert not wrong, f"ranks not naming the origin: {wrong}"
    (claim,) = [key for key in claims if not key.endswith("/done")]
    assert sorted(claims) == [claim, f"{claim}/done"]
    assert json.loads(claims[claim])["rank"] in survivors
