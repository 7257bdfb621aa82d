"""The probe confirms what the signals find: a job on four namespace hosts probes itself
first (``cclctl.probe.in_job.probe``), then trains (ring all_reduce, one rank a host) while
htb slows h1 -> h2; `cclctl diagnose slow --store` names the slow link from the job's own
traffic and says the job's probe flagged the same directed link, and `cclctl top` shows
the probe's line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from netns_job import NETNS_JOB_MARKS
from ports import free_port
from probe_hosts import BridgedHosts

pytestmark = [*NETNS_JOB_MARKS]

WORKER = str(Path(__file__).with_name("probe_train_worker.py"))
VERDICT_S = 150


def _slow_link(net: BridgedHosts, store: str) -> dict[str, Any]:
    """`diagnose slow --store --json` on h0, until its verdict names a slow link."""
    deadline = time.monotonic() + VERDICT_S
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        out = net.cclctl("h0", "diagnose", "slow", "--store", store, "--job", "probe", "--json")
        if out.returncode in (0, 3):
            seen.append(json.loads(out.stdout))
            if any(f["kind"] == "slow_link" for f in seen[-1]["findings"]):
                return seen[-1]
        time.sleep(0.5)
    raise AssertionError(f"no slow link named in {VERDICT_S} s; the last verdict: {seen[-1:]}")


def test_a_slow_link_the_signals_find_is_confirmed_by_the_jobs_own_probe(tmp_path: Path) -> None:
    net = BridgedHosts(4)
    procs: list[subprocess.Popen[str]] = []
    release = tmp_path / "release"
    try:
        net.slow_link("h1", "h2", "40mbit")
        port = free_port()
        store = f"{net.addr['h0']}:{port}"
        procs = net.start(tmp_path, port, [sys.executable, WORKER], RELEASE=str(release),
                          CCLCTL_SLOW_WINDOW="1", CCLCTL_STATUS_INTERVAL="0.2",
                          CCLCTL_STORE_LINGER="5")  # fmt: skip
        doc = _slow_link(net, store)
        top = net.cclctl("h0", "top", "--json", "--store", store, "--job", "probe",
                         "--stale", "600", "--slow", "600")  # fmt: skip
        release.touch()
        codes = [p.wait(60) for p in procs]
        _, err0 = procs[0].communicate(timeout=10)
    finally:
        release.touch()
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        net.close()

    assert codes == [0, 0, 0, 0] and "probed published=True" in err0, err0
    [finding] = [f for f in doc["findings"] if f["kind"] == "slow_link"]
    assert finding["link"] == [1, 2]
    [said] = [e for e in finding["evidence"] if "probe" in e]
    assert said.startswith("confirmed by the probe ") and "rank 1 -> rank 2 (h1 -> h2)" in said
    assert doc["probe"]["confirmed"] == 1
    assert all((f["src"], f["dst"]) != (1, 2) for f in doc["probe"]["unnamed"])
    assert top.returncode == 0, top.stderr
    assert "1->2 slow (h1->h2)" in json.loads(top.stdout)["probe"]["line"]
