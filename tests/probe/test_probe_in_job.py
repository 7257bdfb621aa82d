"""A probe inside a live job feeds the rest, with real processes: `cclctl launch` runs the
ranks around the job's store; rank 0 publishes the probe there and to its metrics; `cclctl
top` and `cclctl diagnose slow --store` (separate processes, without the job's token, as an
operator on another machine) read it. A baseline far above every link makes each one a
finding, so there is something to show."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ports import free_port_block
from prometheus_client.parser import text_string_to_metric_families

from cclctl.config import job_dir
from cclctl.store import pidfile

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

WORKER = str(Path(__file__).with_name("in_job_worker.py"))
FAST = 1e15  # bytes/s: no link is this fast, so every link is below the baseline
WAIT_S = 90


class Launched:
    """``cclctl launch -n N -- CMD``: its stderr and stdout lines as they come."""

    def __init__(self, tmp: Path, n: int, cmd: list[str], env: dict[str, str]) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
        self.env = {**base, "TMPDIR": str(tmp), "CCLCTL_STORE_LINGER": "30", **env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cclctl", "launch", "-n", str(n), "--", *cmd],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.out: queue.Queue[str | None] = queue.Queue()
        self.err: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        for stream, q in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._pump, args=(stream, q), daemon=True).start()
        words = self.line(self.err, "cclctl: job ").split()  # "cclctl: job J store S; ..."
        self.job, self.store = words[2], words[4].rstrip(";")

    def _pump(self, stream: Any, q: queue.Queue[str | None]) -> None:
        for line in stream:
            self.seen.append(line)
            q.put(line)
        q.put(None)

    def line(self, q: queue.Queue[str | None], starts: str) -> str:
        while True:
            try:
                line = q.get(timeout=WAIT_S)
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError(f"no line starting {starts!r}: {''.join(self.seen)}")
            if line.startswith(starts):
                return line.strip()

    def cclctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A cclctl command of the operator's (no token: the job's folder is elsewhere)."""
        env = {k: v for k, v in self.env.items() if not k.startswith("CCLCTL_")}
        env["TMPDIR"] = str(Path(self.env["TMPDIR"]) / "operator")
        Path(env["TMPDIR"]).mkdir(exist_ok=True)
        return subprocess.run([sys.executable, "-m", "cclctl", *args, "--store", self.store,
                               "--job", self.job], env=env, capture_output=True, text=True,
                              timeout=WAIT_S)  # fmt: skip

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        port = int(self.store.rpartition(":")[2])
        record = pidfile.read(pidfile.path(job_dir(self.job, self.env), port))
        if record is not None:  # the lingering store: gone now, not 30 s from now
            os.kill(int(record["pid"]), signal.SIGTERM)


@pytest.fixture
def launched() -> Iterator[list[Launched]]:
    made: list[Launched] = []
    yield made
    for job in made:
        job.close()


def _top_and_slow(job: Launched) -> tuple[dict[str, Any], dict[str, Any]]:
    top = job.cclctl("top", "--json", "--stale", "600", "--slow", "600")
    assert top.returncode == 0, top.stderr
    slow = job.cclctl("diagnose", "slow", "--json")
    assert slow.returncode in (0, 3), slow.stderr
    return json.loads(top.stdout), json.loads(slow.stdout)


def test_a_launched_probe_is_shown_by_top_and_is_evidence_for_diagnose_slow(
    tmp_path: Path, launched: list[Launched]
) -> None:
    good = tmp_path / "fast.json"
    link = {"src": 0, "dst": 1, "kind": "shm", "status": "ok", "bandwidth": FAST}
    doc = {"schema": "cclctl.probe", "version": 1, "links": [link]}
    good.write_text(json.dumps(doc))
    job = Launched(tmp_path, 2, [sys.executable, "-m", "cclctl", "probe", "-e", "64K",
                                 "--baseline", str(good)], {})  # fmt: skip
    launched.append(job)
    assert job.proc.wait(WAIT_S) == 3  # rank 0's exit: something was flagged
    top, slow = _top_and_slow(job)

    assert [f["kind"] for f in top["probe"]["findings"]] == ["slow_link", "slow_link"]
    assert top["probe"]["links"] == 2
    line = top["probe"]["line"]
    assert line.startswith("probe ") and line.endswith(": 0->1 slow; 1->0 slow")
    assert len(line) <= 80
    shown = job.cclctl("top", "--once", "--stale", "600", "--slow", "600").stdout
    assert line.split(": ", 1)[1] in shown  # the same words on the screen
    assert slow["probe"]["links"] == 2 and slow["probe"]["confirmed"] == 0
    assert [(f["kind"], f["src"], f["dst"]) for f in slow["probe"]["unnamed"]] == [
        ("slow_link", 0, 1), ("slow_link", 1, 0)
    ]  # fmt: skip
    text = job.cclctl("diagnose", "slow").stdout
    assert "probe " in text and "2 findings" in text
    assert "   - probe slow_link: rank 0 -> rank 1" in text


def test_a_training_scripts_probe_is_served_as_metrics_while_the_job_runs(
    tmp_path: Path, launched: list[Launched]
) -> None:
    go = tmp_path / "go"
    port = free_port_block(2)
    job = Launched(tmp_path, 2, [sys.executable, WORKER, str(go), str(FAST)],
                   {"CCLCTL_METRICS_PORT": str(port)})  # fmt: skip
    launched.append(job)
    said = job.line(job.out, "[rank 0] probed ")
    assert "published=True" in said
    url = said.rpartition("metrics=")[2]
    with urllib.request.urlopen(url, timeout=WAIT_S) as reply:
        text = reply.read().decode()
    got = {
        (s.name, s.labels.get("src"), s.labels.get("dst"), s.labels.get("kind")): s.value
        for f in text_string_to_metric_families(text) if f.name.startswith("cclctl_probe")
        for s in f.samples
    }  # fmt: skip
    assert got[("cclctl_probe_link_flagged", "0", "1", "shm")] == 1
    assert got[("cclctl_probe_link_flagged", "1", "0", "shm")] == 1
    assert got[("cclctl_probe_link_bandwidth_bytes_per_second", "0", "1", "shm")] > 0
    assert got[("cclctl_probe_findings", None, None, "slow_link")] == 2
    assert got[("cclctl_probe_links", None, None, None)] == 2
    top, _ = _top_and_slow(job)  # the job runs on: live statuses and the probe beside them
    assert top["probe"]["line"].endswith(": 0->1 slow; 1->0 slow")
    assert all(r["state"] != "done" for r in top["ranks"])
    go.touch()
    assert job.proc.wait(WAIT_S) == 0, "".join(job.seen)
