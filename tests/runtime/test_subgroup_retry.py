"""A sub-communicator rides through a link fault as the world does, among its members alone.

Four real ranks over TCP (``cclctl launch``), a group of job ranks 1-3 (group ranks 0-2,
id ``sub:1-3``), job rank 3 closing its link to group rank 0 (job rank 1) before the
group's seq 2 (``CCLCTL_FAULT=link:...:comm=sub:1-3``): with retry on (the default budget),
every member's all_reduces give the exact sum, its records show seq 2's first attempt in
epoch 0 and its retry (attempt 2) in epoch 1; the world's all_reduce after it is exact and
the world never retried; job rank 0, outside the group, is untouched. A group link ended
mid-call resumes in the step, as the world's do. With ``CCLCTL_RETRY_BUDGET=0`` the
group's call fails as before, naming the peer.

And the job's side of a group's retry (:class:`~cclctl.runtime.job.retry.Retry`) on a real
store: it leaves the job's revoke record and the acknowledgements to the world (it follows
none), stops waiting at once when a member died (whatever communicator saw it), and maps
its group ranks to their job ranks' processes at its close. Needs no root.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from retry_worker import rank_input

from cclctl import revocation
from cclctl.config import RuntimeConfig
from cclctl.errors import CommError
from cclctl.revocation import Revocation
from cclctl.runtime.comm.recovery.retry_rules import Ask
from cclctl.runtime.failure import FailureState
from cclctl.runtime.identity import RankIdentity
from cclctl.runtime.job.retry import Retry
from cclctl.store.client import StoreClient, StoreServer
from cclctl.store.scope import ScopedStore
from scripts import script

WORLD, COUNT, ITERS, JOB = 4, 65536, 3, "subretry"
MEMBERS = [1, 2, 3]
SUB = "sub:1-3"
#: job rank 3 cuts its link to group rank 0 (job rank 1) before the group's seq 2
FAULT = f"link:rank=3:seq=2:peer=0:comm={SUB}"

pytestmark = pytest.mark.timeout(120)


def _sum_digest(ranks: list[int], count: int = COUNT) -> str:
    total = np.sum([rank_input(r, count).astype(np.float64) for r in ranks], axis=0)
    return hashlib.sha256(total.astype(np.float32).tobytes()).hexdigest()


def _launch(tmp: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    env |= {
        "CCLCTL_JOB": JOB,
        "CCLCTL_TRACE_DIR": str(tmp),
        "CCLCTL_TRANSPORT": "tcp",
        "MEMBERS": ",".join(map(str, MEMBERS)),
        "COUNT": str(COUNT),
        "ITERS": str(ITERS),
        **({"CCLCTL_FAULT": FAULT} | extra),
    }
    launch = [sys.executable, "-m", "cclctl", "launch", "-n", str(WORLD), "--", sys.executable]
    cmd = [*launch, script("subgroup_retry_worker.py")]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100)


def _lines(out: str, rank: int) -> list[str]:
    return [ln.split("] ", 1)[-1] for ln in out.splitlines() if f"[rank {rank}]" in ln]


@pytest.mark.slow
def test_a_subgroup_link_fault_is_retried_exactly_and_the_world_is_untouched(
    tmp_path: Path,
) -> None:
    out = _launch(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    group_sum, world_sum = _sum_digest(MEMBERS), _sum_digest(list(range(WORLD)))
    for rank in MEMBERS:
        lines = _lines(out.stdout, rank)
        assert [ln for ln in lines if ln.startswith("sub ")] == [
            f"sub {i} {group_sum}" for i in range(ITERS)
        ], lines
        records = [ln.split()[1:] for ln in lines if ln.startswith("record ")]
        seq2 = [r for r in records if r[0] == "2"]
        # the attempt the cut ended (on the cutting rank, or ended by the spread elsewhere),
        # then its retry in the next epoch
        assert [r[1:3] for r in seq2] == [["1", "0"], ["2", "1"]], records
        assert seq2[0][3] in ("failed", "aborted") and seq2[1][3] == "completed", records
        assert ["3", "1", "1", "completed"] in records, records
        assert "sub_epoch 1" in lines, lines
    for rank in range(WORLD):
        lines = _lines(out.stdout, rank)
        assert f"world {world_sum}" in lines and "world_epoch 0" in lines, lines
        assert lines[-1] == "done", lines
    outsider = _lines(out.stdout, 0)
    assert not [ln for ln in outsider if ln.split()[0] in ("sub", "record", "sub_epoch")]


@pytest.mark.slow
def test_a_subgroup_link_reset_mid_call_resumes_in_the_step(tmp_path: Path) -> None:
    """The group's links keep tails and resume as the world's do: job rank 2 ends its link
    to the group's rank 2 (job rank 3) with ``shutdown`` while its first 32 MiB all_reduce
    runs; the link is made again in the step (a resume counted at both ends, no retry),
    and every result is exact."""
    count = 8 << 20
    out = _launch(tmp_path, CCLCTL_FAULT="", RESET="2:2", COUNT=str(count))
    assert out.returncode == 0, out.stdout + out.stderr
    want = _sum_digest(MEMBERS, count)
    for rank in MEMBERS:
        lines = _lines(out.stdout, rank)
        assert [ln for ln in lines if ln.startswith("sub ")] == [
            f"sub {i} {want}" for i in range(ITERS)
        ], lines
        # both ends of the reset link made it again; nothing was retried
        assert f"resumed {1 if rank in (2, 3) else 0}" in lines, lines
        assert "sub_epoch 0" in lines, lines


@pytest.mark.slow
def test_with_retry_off_the_subgroup_call_fails_naming_the_peer(tmp_path: Path) -> None:
    out = _launch(tmp_path, CCLCTL_RETRY_BUDGET="0")
    assert out.returncode != 0, out.stdout
    failed = {
        rank: ln
        for rank in MEMBERS
        for ln in _lines(out.stdout, rank)
        if ln.startswith("failed 1 ")
    }
    assert failed, out.stdout + out.stderr
    # the cutting rank's error names the link it lost, by job ranks, as with no group
    assert "link between rank 1 and rank 3 broke" in failed.get(3, ""), failed
    assert not any(ln.startswith("sub 1 ") for r in MEMBERS for ln in _lines(out.stdout, r))


# ---------------------------------------------------------------- the job's side, in process
GROUP = "sub:1,3"  # job ranks 1 and 3: group ranks 0 and 1


def _retry(server: StoreServer, follows_record: bool) -> Retry:
    return Retry(
        RuntimeConfig(retry_budget_s=20), job=JOB, store=server.address, token="",
        store_host=server.host, telemetry=None, follows_record=follows_record,
    )  # fmt: skip


def _port(comm_id: str, members: list[int], peers: list[tuple[str, int]] = []) -> Any:  # noqa: B006
    """Group rank 0 of ``members``: a real failure state, a transport that only closes."""
    identity = RankIdentity(socket.gethostname(), "", peers)
    failure = FailureState(rank=0, comm=comm_id, members=members, identity=identity)
    renewed: list[object] = []
    return SimpleNamespace(
        id=comm_id, rank=0, world_size=len(members), members=members, failure=failure,
        transport=SimpleNamespace(close=lambda: None), renew=renewed.append, renewed=renewed,
        cfg=RuntimeConfig(retry_budget_s=20),
    )  # fmt: skip


def _ask(deadline_s: float = 600.0) -> Ask:
    return Ask("all_reduce", 2, 1, attempt=2, deadline=time.monotonic() + deadline_s)


def _scoped(server: StoreServer) -> tuple[StoreClient, ScopedStore]:
    client = StoreClient(server.host, server.port)
    return client, ScopedStore.for_job(client, JOB)


@pytest.mark.parametrize(
    ("comm_id", "members", "follows", "left"),
    [
        (GROUP, [1, 3], False, {revocation.KEY, "revoke_ack/0", "revoke_ack/1"}),
        ("0:0-1", [0, 1], True, {"revoke_ack/1"}),  # the world clears its own rank's ack
    ],
)
def test_only_the_world_s_retry_clears_the_job_record_and_its_ack(
    server: StoreServer, monkeypatch: pytest.MonkeyPatch, comm_id: str, members: list[int],
    follows: bool, left: set[str],
) -> None:  # fmt: skip
    """An operator's retry record (of every communicator) and the ranks' acks are the
    world's to clear: a group's retry, which follows no record, leaves them (else the world
    could miss the operator's retry), while the world's retry clears them as before."""
    operator = Revocation(
        kind="retry", origin=revocation.OPERATOR, reason="drill", seen_by=revocation.OPERATOR,
        via="operator",
    )  # fmt: skip
    port = _port(comm_id, members)
    client, scoped = _scoped(server)
    with client:
        scoped.set(revocation.KEY, operator.encode())
        for r in (0, 1):
            scoped.set(revocation.ack_key(r), b"1")
        peer = json.dumps(dataclasses.asdict(_ask())).encode()  # group rank 1 is there
        scoped.set(f"retry/{comm_id}/1/in/1", peer)
        fresh = SimpleNamespace(close=lambda: None)
        monkeypatch.setattr(Retry, "_build", lambda *args: fresh)
        plan = _retry(server, follows)(port, _ask())
        assert plan.rerun == 2 and port.renewed == [fresh] and port.failure.epoch == 1
        present = {k for k in (revocation.KEY, "revoke_ack/0", "revoke_ack/1") if scoped.try_get(k)}
        assert present == left
        assert scoped.try_get(f"retry/{comm_id}/1/up/0") == b"1"


@pytest.mark.timeout(30)
def test_a_group_retry_stops_at_once_when_a_member_died(server: StoreServer) -> None:
    """A member's death that the world saw (its record names the world, in the world's
    epoch 0) ends a group's retry at once, in the group's epoch 1 too: that rank never
    joins, so its agreement raises the death, naming it, instead of waiting out the budget."""
    died = Revocation(
        kind="died", origin=3, reason="SIGKILL", comm="0:0-3", seen_by=2, via="pidfd"
    )  # fmt: skip
    port = _port(GROUP, [1, 3])
    port.failure.bump_epoch()  # a first retry of the group got past an earlier link fault
    client, scoped = _scoped(server)
    with client:
        scoped.set(revocation.KEY, died.encode())
    with pytest.raises(CommError) as raised:
        _retry(server, False)(port, _ask())
    assert raised.value.revocation == died
    assert "rank 3" in str(raised.value) and "SIGKILL" in str(raised.value), raised.value


def test_a_group_retry_maps_its_ranks_to_job_ranks_for_processes_gone(
    server: StoreServer,
) -> None:
    """At its close a group's rank waits for every member to close, counting as closed a
    member whose process on this host is gone: group rank 1 is job rank 3, whose process is
    gone (job rank 1's, at the same index as the group rank, is alive: this one)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    here = socket.gethostname()
    peers = [(here, os.getpid()), (here, os.getpid()), (here, os.getpid()), (here, gone.pid)]
    port = _port(GROUP, [1, 3], peers)
    assert _retry(server, False).all_closed(port, _ask(), wait_s=10.0)
