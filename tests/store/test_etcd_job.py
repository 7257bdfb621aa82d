"""A real local job on an etcd store: two env-launched ranks with
``CCLCTL_STORE=etcd://...`` join, all-reduce and publish their statuses, which ``cclctl
top --store etcd://...`` and ``diagnose hang --store etcd://...`` read; the etcd member
every rank talked to is killed (by pid) and the job goes on through the others."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etcd_cluster import EtcdCluster, etcd_cluster
from processes import until

from cclctl.live import snapshot
from cclctl.records import RankSnapshot
from cclctl.store.etcd.client import EtcdClient
from scripts import script

pytestmark = pytest.mark.timeout(120)
JOB = "etcd-job"


class Ranks:
    """Rank processes started by the test; their stdout's JSON lines in one queue."""

    def __init__(self, size: int, env: dict[str, str]) -> None:
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.procs: list[subprocess.Popen[str]] = []
        for rank in range(size):
            proc = subprocess.Popen(
                [sys.executable, script("etcd_worker.py")],
                env=dict(env, RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank)),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            self.procs.append(proc)
            threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        self.other: list[str] = []

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
            else:
                self.other.append(line.rstrip())

    def next_lines(self, count: int, within_s: float = 60) -> list[dict[str, Any]]:
        try:
            return [self.lines.get(timeout=within_s) for _ in range(count)]
        except queue.Empty:
            raise AssertionError("ranks said: " + "\n".join(self.other[-30:])) from None

    def wait(self, within_s: float = 60) -> list[int]:
        return [proc.wait(timeout=within_s) for proc in self.procs]

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    with etcd_cluster(tmp_path / "etcd", 3) as running:
        yield running


def _cclctl(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "cclctl", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _statuses(client: EtcdClient) -> dict[int, RankSnapshot]:
    """Every rank's last status, as the store holds it (its own, or its host agent's)."""
    return snapshot.fetch(client, JOB).statuses


def _completed(client: EtcdClient, seq: int) -> bool:
    """Both ranks' statuses say the world completed ``seq``."""
    found = _statuses(client)
    return len(found) == 2 and all(s.comms["0:0-1"].last_completed >= seq for s in found.values())


def test_job_on_etcd_survives_the_loss_of_its_member(cluster: EtcdCluster, tmp_path: Path) -> None:
    go = str(tmp_path / "go")
    env = dict(
        os.environ,
        CCLCTL_STORE=cluster.address,
        CCLCTL_JOB=JOB,
        CCLCTL_TOKEN="etcd-test-token-0123456789abcdef",
        CCLCTL_STATUS_INTERVAL="0.2",
        GO=go,
        PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])),
    )
    ranks = Ranks(2, env)
    try:
        assert sorted(line["sum"] for line in ranks.next_lines(2)) == [3.0, 3.0]
        with EtcdClient.from_address(cluster.address, connect_timeout_s=10) as reader:
            until("the 5 all-reduces in the statuses", lambda: _completed(reader, 5), 30)
        top = _cclctl("top", "--store", cluster.address, "--job", JOB, "--once", "--json")
        assert top.returncode == 0, top.stderr
        doc = json.loads(top.stdout)
        assert sorted(row["rank"] for row in doc["ranks"]) == [0, 1], doc
        hang = _cclctl("diagnose", "hang", "--store", cluster.address, "--job", JOB)
        assert hang.returncode == 0, hang.stderr
        assert "live statuses of 2/2 ranks" in hang.stdout and "HEALTHY" in hang.stdout

        cluster.kill(0)  # the member every rank's clients talked to first
        Path(f"{go}.1").touch()  # one more all-reduce, then its status through another member
        assert sorted(line["sum"] for line in ranks.next_lines(2)) == [3.0, 3.0]
        with EtcdClient.from_address(cluster.address, connect_timeout_s=10) as reader:
            until("the 6th all-reduce in the statuses", lambda: _completed(reader, 6), 30)
        top = _cclctl("top", "--store", cluster.address, "--job", JOB, "--once", "--json")
        assert top.returncode == 0, top.stderr
        assert sorted(row["rank"] for row in json.loads(top.stdout)["ranks"]) == [0, 1]
        hang = _cclctl("diagnose", "hang", "--store", cluster.address, "--job", JOB)
        assert hang.returncode == 0 and "HEALTHY" in hang.stdout, hang.stderr
        Path(f"{go}.stop").touch()
        assert ranks.wait() == [0, 0], "\n".join(ranks.other[-30:])
    finally:
        ranks.kill()


DIES = """
import sys
import numpy as np
import cclctl
comm = cclctl.init()
x = np.ones(4, np.float32)
comm.all_reduce(x)
print("sum", float(x[0]), flush=True)
if comm.rank == 1:
    sys.exit(3)
comm.all_reduce(x)  # rank 0 waits here until the launcher's record fails it
"""


def test_cclctl_launch_runs_its_job_on_etcd_and_records_a_death_there(tmp_path: Path) -> None:
    with etcd_cluster(tmp_path / "etcd", 1) as cluster:
        path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, CCLCTL_STORE=cluster.address, CCLCTL_JOB="launched-on-etcd",
                   CCLCTL_TRACE_DIR=str(tmp_path / "dumps"), PYTHONPATH=path)  # fmt: skip
        cmd = [sys.executable, "-m", "cclctl", "launch", "-n", "2", "--grace", "2", "--",
               sys.executable, "-c", DIES]  # fmt: skip
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
        assert done.returncode == 3, done.stderr
        assert sorted(done.stdout.split("\n")[:2]) == ["[rank 0] sum 2.0", "[rank 1] sum 2.0"]
        assert f"--store {cluster.address}" in done.stderr  # where to watch: the cluster
        last = done.stderr.splitlines()[-1]  # named as exited, or as died in its call
        assert re.match(
            r"cclctl launch: rank 1 \(pid \d+\) (exited with code 3|died \(exit code 3\))", last
        )
        with EtcdClient.from_address(cluster.address, connect_timeout_s=10) as reader:
            record = json.loads(reader.get("cclctl/launched-on-etcd/revoke", timeout_s=5))
        # a death's witness: the launcher, or the survivor's pidfd on rank 1 (same host),
        # whichever records it first
        assert (record["kind"], record["origin"]) == ("died", 1)
        assert record["via"] in ("launcher", "pidfd"), record
        port = subprocess.run([*cmd[:4], "--port", "5000", "--", "true"], env=env,
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert port.returncode == 2 and "leave --port out" in port.stderr
