"""``ss -K`` of the rank-to-rank connections between two network-namespace hosts during DDP
training on the ``cclctl`` backend is ridden through: the unedited gloo job
(gloo_ddp_job.py, no backend named) under ``cclctl run --backend cclctl``, 4 ranks, 2 per
"host" (shared memory within one, TCP between them: tests/support/netns_job.py's hosts),
trains to the losses and parameters of an undisturbed run on the same hosts, and its
counters show the links made again (a resume) or the call retried. Rank 0 pauses before a
training step (the others wait in its first bucket's all_reduce) while h2 resets every
connection to h1 but the two stores'. Needs root, iproute2 and unshare; skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netns_job import ADDRS, NEEDS_NAMESPACES, TOKEN, TwoHosts, sh
from ports import free_port_block

pytest.importorskip("torch")

from torch_jobs import CCLCTL, HERE, PY

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(420), NEEDS_NAMESPACES]
WORLD, HOST_OF = 4, {0: "h1", 1: "h1", 2: "h2", 3: "h2"}
PAUSE_STEP = 3


@pytest.fixture(scope="module")
def hosts() -> Iterator[TwoHosts]:
    two = TwoHosts()
    try:
        yield two
    finally:
        two.close()


def _start(hosts: TwoHosts, out: Path, port: int, **extra: str) -> list[subprocess.Popen[str]]:
    """The job's 4 ranks, each ``cclctl run --backend cclctl -- python gloo_ddp_job.py``
    inside its host's namespace, torch's store on ``port`` and cclctl's beside it."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    procs = []
    for rank in range(WORLD):
        host = HOST_OF[rank]
        (out / host).mkdir(exist_ok=True)
        env = {**base, "TMPDIR": str(out / host), "RANK": str(rank), "WORLD_SIZE": str(WORLD),
               "LOCAL_RANK": str(rank % 2), "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": ADDRS["h1"], "MASTER_PORT": str(port), "CCLCTL_JOB": "moved",
               "CCLCTL_TOKEN": TOKEN, "CCLCTL_STORE_LINGER": "5", "PYTHONWARNINGS": "ignore",
               "OMP_NUM_THREADS": "1", **extra}  # fmt: skip
        job = [CCLCTL, "run", "--backend", "cclctl", "--", PY, str(HERE / "gloo_ddp_job.py")]
        uts = ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$0" "$@"']
        cmd = hosts.exec(host, *uts, *job, str(out), "none")
        procs.append(
            subprocess.Popen(
                cmd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    return procs


def _finish(procs: list[subprocess.Popen[str]], out: Path) -> dict[int, dict[str, Any]]:
    outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank}: {outputs[rank][-3000:]}"
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)}


def _reset_links(hosts: TwoHosts, port: int) -> int:
    """``ss -K`` on h2: every TCP connection to h1 but torch's and cclctl's stores' is
    reset; how many were."""
    flt = f"( dst {ADDRS['h1']} and not dport = :{port} and not dport = :{port + 1} )"
    out = sh(*hosts.exec("h2", "ss", "-K", "-H", "-tn", "state", "established", flt))
    return sum(1 for line in out.stdout.splitlines() if line.strip())


def _paused(flag: Path, procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 150
    while not Path(f"{flag}.paused").exists():
        assert all(p.poll() is None for p in procs), "a rank ended before rank 0 paused"
        assert time.monotonic() < deadline, "rank 0 never paused"
        time.sleep(0.1)


def test_ss_k_between_hosts_during_ddp_is_ridden_through(hosts: TwoHosts, tmp_path: Path) -> None:
    calm_out, fault_out = tmp_path / "calm", tmp_path / "fault"
    calm_out.mkdir()
    fault_out.mkdir()
    calm = _finish(_start(hosts, calm_out, free_port_block(2)), calm_out)
    port, flag = free_port_block(2), fault_out / "go"
    procs = _start(hosts, fault_out, port, PAUSE_STEP=str(PAUSE_STEP), PAUSE_FLAG=str(flag))
    try:
        _paused(flag, procs)
        resets = _reset_links(hosts, port)
    finally:
        flag.touch()
    fault = _finish(procs, fault_out)
    assert resets >= 1  # ranks 0-1 are linked to 2-3 over the veth
    for rank in range(WORLD):
        assert fault[rank]["backend"] == "cclctl"
        assert fault[rank]["losses"] == calm[rank]["losses"]
        assert fault[rank]["params"] == calm[rank]["params"]
        assert calm[rank]["counters"] == {"retries": 0, "link_resumes": 0}
    ridden = [fault[r]["counters"] for r in range(WORLD)]
    assert sum(c["retries"] + c["link_resumes"] for c in ridden) >= 1, ridden
