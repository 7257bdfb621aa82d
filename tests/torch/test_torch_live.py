"""An instrumented gloo job that hangs, watched the way an SRE would: started by
`cclctl launch` or torchrun through `cclctl run`, seen live by `cclctl top`, diagnosed by
`cclctl diagnose hang --store` and from the dumps the watchdog makes every rank write.

The job (train_job.py ``hang``): rank 0 waits in all_reduce seq 3 of ``0:0-1`` while rank 1
stays in its own code until the test creates a file, after which the job ends normally.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from torch_jobs import CCLCTL, HERE, TORCHRUN, free_port, released_job, until_seen

from cclctl.errors import CclError
from cclctl.live.snapshot import fetch
from cclctl.store.client import StoreClient

pytestmark = pytest.mark.slow  # real gloo jobs, diagnosed live

EXIT_FAULT = 3


def _cclctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CCLCTL, *args], capture_output=True, text=True, timeout=30)


def _hung(store: str) -> bool:
    """Both ranks publish and rank 0's latest status shows it inside seq 3 for longer than
    the ``--stuck-after 1`` the tests diagnose with (polled in-process: cheap).
    """
    try:
        with StoreClient.from_address(store, connect_timeout_s=1, timeout_s=5) as client:
            statuses = fetch(client).statuses
    except CclError:
        return False
    rank0 = statuses.get(0)
    if len(statuses) != 2 or rank0 is None or rank0.inflight is None:
        return False
    return rank0.inflight.seq == 3 and rank0.time_ns - rank0.inflight.start_ns > 1.5e9


def _top(store: str) -> dict[str, Any]:
    out = _cclctl("top", "--store", store, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _verdicts(out: subprocess.CompletedProcess[str]) -> list[tuple[Any, ...]]:
    assert out.returncode == EXIT_FAULT, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    return [(v["kind"], v["suspects"], v["comm"], v["seq"], v["op"]) for v in doc["verdicts"]]


NOT_ENTERED = [("not_entered", "1", "0:0-1", 3, "all_reduce")]


@pytest.mark.timeout(120)
def test_launch_top_and_diagnose_a_hung_instrumented_job(tmp_path: Path) -> None:
    port, trace, flag = free_port(), tmp_path / "traces", tmp_path / "go"
    job = [sys.executable, str(HERE / "train_job.py"), "hang", str(flag)]
    run = [CCLCTL, "run", "--timeout", "2", "--trace-dir", str(trace), "--"]
    launch = [CCLCTL, "launch", "--port", str(port), "-n", "2", "--timeout", "90", "--"]
    store = f"127.0.0.1:{port}"
    with released_job(launch + run + job, [flag]) as proc:
        until_seen("rank 0 waiting", lambda: _hung(store), proc, 60)
        top = _top(store)
        assert (top["world_size"], top["ranks_seen"]) == (2, 2)
        ranks = {r["rank"]: r for r in top["ranks"]}
        assert ranks[0]["current"]["op"] == "all_reduce"
        assert ranks[1]["current"] is None
        assert ranks[1]["comms"]["0:0-1"] == {"last_started": 2, "last_completed": 2}
        live = _cclctl("diagnose", "hang", "--store", store, "--stuck-after", "1", "--json")
        assert _verdicts(live) == NOT_ENTERED
        # past --timeout the watchdog of rank 0 dumps, and asks rank 1 to dump too
        names = until_seen(
            "two dumps", lambda: len(list(trace.glob("cclctl-*-rank*.json"))) == 2, proc, 30
        )
        assert names
        dumps = _cclctl("diagnose", "hang", str(trace), "--stuck-after", "1", "--json")
        assert _verdicts(dumps) == NOT_ENTERED
        flag.touch()
        proc.wait(timeout=30)
    output = proc.stdout.read() if proc.stdout else ""
    assert proc.returncode == 0, output
    assert "released" in output
    assert "HANG: rank 0: all_reduce seq 3 on comm 0:0-1" in output
    # nothing of cclctl's can raise into a gloo call: the log says what happens instead
    assert "policy raise" not in output and "until torch's own timeout" in output


@pytest.mark.timeout(120)
def test_torchrun_through_cclctl_run_publishes_to_master_port_plus_one(tmp_path: Path) -> None:
    if not Path(TORCHRUN).exists():
        pytest.skip("torchrun is not installed next to this Python")
    port, flag = free_port(), tmp_path / "go"
    cmd = [
        CCLCTL, "run", "--", TORCHRUN, "--nnodes", "1", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(port), "--rdzv-id", "trainer",
        str(HERE / "train_job.py"), "hang", str(flag),
    ]  # fmt: skip
    store = f"127.0.0.1:{port + 1}"
    with released_job(cmd, [flag]) as proc:
        until_seen("rank 0 waiting", lambda: _hung(store), proc, 90)
        top = _top(store)
        assert top["job"] == "trainer"  # torchrun's run id names the job
        live = _cclctl("diagnose", "hang", "--store", store, "--stuck-after", "1", "--json")
        assert _verdicts(live) == NOT_ENTERED
        flag.touch()
        proc.wait(timeout=30)
    output = proc.stdout.read() if proc.stdout else ""
    assert proc.returncode == 0, output
    assert f"cclctl top --store {store} --job trainer" in output
