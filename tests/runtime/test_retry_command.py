"""`cclctl retry` on a live job across two network-namespace "hosts", 2 ranks each.

Ranks 0-1 share memory on h1, ranks 2-3 on h2, and the hosts talk TCP (the hybrid
transport), as in ``test_retry_multihost.py``. The ranks run all_reduce after all_reduce,
each checking its result against the exact sum. A job stuck behind a frozen rank, or
behind a link blackholed with ``iptables -j DROP`` in one direction, is retried by the
operator: every rank's call ends, the ranks renew their links under the next epoch and
re-run with exact results, with no process restarted; the revoke key is reusable after.
Needs root, iproute2, iptables and unshare; skipped elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from netns_job import ADDRS, JOB, NETNS_JOB_MARKS, TOKEN, NetJob, TwoHosts, sh
from ports import free_port
from test_retry_multihost import Lines

pytestmark = NETNS_JOB_MARKS

WORKER = str(Path(__file__).parents[1] / "support" / "retry_command_worker.py")


def _job(hosts: TwoHosts, tmp: Path, **extra: str) -> tuple[NetJob, Lines, Path]:
    release = tmp / "release"
    env = {
        "CCLCTL_RETRY_BUDGET": "30",
        "CCLCTL_ON_HANG": "wait",  # nothing but the operator ends a stuck call
        "COUNT": str(1 << 20),
        "RELEASE": str(release),
        **extra,
    }
    job = NetJob(hosts, tmp, free_port(), timeout_s=60, worker=WORKER, extra=env)
    lines = Lines(job)
    for rank in range(4):
        lines.wait(rank, r"ready \d+$")
    return job, lines, release


def _retry(job: NetJob, host: str, *args: str) -> tuple[int, str, str]:
    out = job.cclctl(host, "retry", "--store", job.store, "--job", JOB, *args)
    return out.returncode, out.stdout, out.stderr


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def _finish(job: NetJob, lines: Lines, release: Path, min_epoch: int) -> None:
    """Release the ranks: each made every call exact and ends on a later epoch, exit 0."""
    release.touch()
    for rank in range(4):
        done = lines.wait(rank, r"done \d+ \d+ \d+$").split()
        calls, wrong, epoch = int(done[1]), int(done[2]), int(done[3])
        assert calls > 0 and wrong == 0, (rank, lines.seen[rank])
        assert epoch >= min_epoch, (rank, lines.seen[rank])
        assert job.procs[rank].wait(30) == 0, lines.seen[rank]


def test_a_frozen_then_resumed_rank_is_retried_and_the_key_reused(
    hosts: TwoHosts, tmp_path: Path
) -> None:
    job, lines, release = _job(hosts, tmp_path)
    frozen = job.rank_pid(3)
    try:
        os.kill(frozen, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not _stopped(frozen):
            assert time.monotonic() < deadline, "rank 3 never stopped"
        code, out, err = _retry(job, "h1", "--reason", "drill", "--wait", "1")
        assert code == 3, out + err
        assert err.strip() == (
            f"cclctl: error: rank 3 of job {JOB!r} did not rejoin the retry within 1s"
        ), err
        assert "retried job netjob (4 ranks): retry asked by operator " in out, out
        assert "ranks 0-2: all_reduce seq " in out and "agreed, renewing its links" in out, out
        assert "  rank 3 (pid " in out, out
        os.kill(frozen, signal.SIGCONT)  # it adopts the record and joins the others
        for rank in range(4):
            lines.wait(rank, r"epoch 1$")
        code, out, err = _retry(job, "h2", "--json")  # the key was cleared: it works again
        assert code == 0, out + err
        doc = json.loads(out)
        assert doc["written"] and doc["complete"] and doc["missing"] == []
        assert [j["rank"] for j in doc["rejoined"]] == [0, 1, 2, 3]
        assert {(j["op"], j["epoch"], j["up"]) for j in doc["rejoined"]} == {
            ("all_reduce", 2, True)
        }
        seqs = {j["seq"] for j in doc["rejoined"]}  # the same call, or one call apart
        assert max(seqs) - min(seqs) <= 1, doc
        for rank in range(4):
            lines.wait(rank, r"epoch 2$")
        _finish(job, lines, release, min_epoch=2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(frozen, signal.SIGCONT)
        job.kill_ranks()
        hosts.kill_all()


def _wait_for_key(job: NetJob, name: str, timeout_s: float = 30.0) -> None:
    """Block until the job's store holds ``name`` (a client run on h1, with the token)."""
    code = (
        "import sys; from cclctl.store.client import StoreClient\n"
        "with StoreClient.from_address(sys.argv[1], token=sys.argv[2], timeout_s=60) as c:\n"
        "    c.wait([sys.argv[3]], timeout_s=float(sys.argv[4]))\n"
    )
    args = [job.store, TOKEN, f"cclctl/{JOB}/{name}", str(timeout_s)]
    cmd = job.hosts.exec("h1", sys.executable, "-c", code, *args)
    subprocess.run(cmd, check=True, capture_output=True, timeout=timeout_s + 30)


def test_a_blackholed_link_is_retried_once_it_is_back(hosts: TwoHosts, tmp_path: Path) -> None:
    """Packets from h1 to h2 are dropped (the store's excepted) until the ranks have seen
    the link stall (the job's revoke record); once the rule goes, the operator's retry
    (or the one under way, which it waits for) re-runs the call with exact results."""
    job, lines, release = _job(hosts, tmp_path)
    rule = ["INPUT", "-s", ADDRS["h1"], "-p", "tcp", "!", "--sport", str(job.port), "-j", "DROP"]
    try:
        sh(*hosts.exec("h2", "iptables", "-I", *rule))
        _wait_for_key(job, "revoke")
        sh(*hosts.exec("h2", "iptables", "-D", *rule))
        code, out, err = _retry(job, "h1", "--wait", "20")
        assert code == 0, out + err
        assert out.startswith(("retried job netjob", "a retry is under way in job netjob")), out
        assert "rejoined: 4 of 4 ranks" in out, out
        assert ": all_reduce seq " in out and "re-running" in out, out
        _finish(job, lines, release, min_epoch=1)
    finally:
        sh(*hosts.exec("h2", "iptables", "-D", *rule), check=False)
        job.kill_ranks()
        hosts.kill_all()
