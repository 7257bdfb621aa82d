"""A rank whose store connections are reset keeps publishing, and is never called stopped.

Three real ranks under ``cclctl launch`` run all_reduce in a loop; ``ss -K`` (iproute2, as
root) destroys every connection rank 2 has to the store, as a conntrack flush would. Its
status must be fresh again (polled with a deadline), say that it reconnected, and
``diagnose hang --store`` must not name it; SIGSTOPped, the same rank is "stopped".
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
from ports import free_port

from cclctl.records import snapshot_from_json
from cclctl.store.client import StoreClient
from scripts import script

JOB = "heal"
RANKS = 3
T = TypeVar("T")

pytestmark = pytest.mark.skipif(
    shutil.which("ss") is None or os.geteuid() != 0,
    reason="killing a socket needs iproute2's ss and root (scripts/test installs it)",
)


def poll(what: str, check: Callable[[], T | None], within_s: float = 30.0) -> T:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        found = check()
        if found is not None:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {within_s:g}s")


@pytest.fixture
def job(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A running 3-rank job: (store address, stop file); stopped and reaped afterwards."""
    port, stop = free_port(), tmp_path / "stop"
    cmd = [sys.executable, "-m", "cclctl", "launch", "-n", str(RANKS), "--port", str(port)]
    cmd += ["--", sys.executable, script("heal_worker.py"), str(stop)]
    # each rank on its own store connection (no host agent): that connection is what is reset
    env = dict(os.environ, CCLCTL_JOB=JOB, CCLCTL_STATUS_INTERVAL="0.5", CCLCTL_HOST_AGENT="0")
    with open(tmp_path / "launch.log", "wb") as log:
        launcher = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        yield f"127.0.0.1:{port}", stop
        stop.touch()
        assert launcher.wait(60) == 0, (tmp_path / "launch.log").read_text()
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()


def statuses(client: StoreClient) -> dict[int, Any]:
    listing = client.list(f"cclctl/{JOB}/status/")
    return {int(k.rsplit("/", 1)[1]): snapshot_from_json(v) for k, v in listing.items()}


def store_connections(pid: int, store_port: int) -> list[int]:
    """The local ports of the process' established connections to the store."""
    conns = psutil.Process(pid).net_connections(kind="tcp")
    return [
        c.laddr.port
        for c in conns
        if c.raddr and c.raddr.port == store_port and c.status == psutil.CONN_ESTABLISHED
    ]


def diagnose(address: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "cclctl", "diagnose", "hang", "--json", "--store", address]
    out = subprocess.run([*cmd, "--job", JOB], capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 3), out.stderr
    return dict(json.loads(out.stdout))


def verdicts_naming(diag: dict[str, Any], rank: int) -> list[str]:
    named = []
    for verdict in diag["verdicts"]:
        if str(rank) in verdict["suspects"].split(","):
            named.append(verdict["kind"])
    return named


@pytest.mark.timeout(120)
def test_a_reset_rank_publishes_again_and_is_not_called_stopped(job: tuple[str, Path]) -> None:
    address, _ = job
    store_port = int(address.rsplit(":", 1)[1])
    with StoreClient.from_address(address, connect_timeout_s=30) as client:
        poll("status from every rank", lambda: len(statuses(client)) == RANKS or None)
        pid = statuses(client)[2].pid
        ports = poll("store connection of rank 2", lambda: store_connections(pid, store_port))
        reset_ns = time.time_ns()
        for local in ports:
            out = subprocess.run(
                ["ss", "-K", "dst", "127.0.0.1", "dport", "=", f":{store_port}", "sport", "=",
                 f":{local}"],
                capture_output=True, text=True,
            )  # fmt: skip
            assert f":{local}" in out.stdout, out

        def healed() -> Any:
            snap = statuses(client)[2]
            return snap if snap.time_ns > reset_ns and snap.counters["store_reconnects"] else None

        snap = poll("fresh status of rank 2 after the reset", healed)
        print(f"rank 2 fresh {(time.time_ns() - reset_ns) / 1e9:.2f}s after ss -K")
        assert snap.counters["store_reconnects"] >= 1
        diag = diagnose(address)
        assert verdicts_naming(diag, 2) == [], diag["verdicts"]
        assert "frozen" not in json.dumps(diag)
        os.kill(pid, signal.SIGSTOP)  # what only the process table can tell: still "stopped"
        try:
            poll("stopped process", lambda: psutil.Process(pid).status() == "stopped" or None)
            assert "stopped" in verdicts_naming(diagnose(address), 2)
        finally:
            os.kill(pid, signal.SIGCONT)
