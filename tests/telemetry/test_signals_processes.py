"""The slowness signals of a real job: four launched ranks, rank 3 made slow by the plan
(``slow:...:delay=``), every rank's finished document carries windows in which rank 3
enters last, spends the least time inside its calls, and is the peer waited on longest
before it arrives (over shared memory, by every rank: the one-copy engine reads every
rank's input; over TCP, by the ranks that receive from it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from ports import free_port_block

from cclctl.records import snapshot_from_dict
from cclctl.slow_signals import Signals

pytestmark = pytest.mark.slow

WORKER = """
import numpy as np, cclctl
comm = cclctl.init()
buf = np.ones(16384, np.float32)
for _ in range(120):
    comm.all_reduce(buf)
comm.close()
"""


def _run(tmp: Path, transport: str) -> dict[int, Signals]:
    worker = tmp / "worker.py"
    worker.write_text(WORKER)
    env = dict(
        os.environ,
        CCLCTL_JOB=f"signals-{transport}",
        CCLCTL_TRACE_DIR=str(tmp),
        CCLCTL_SLOW_WINDOW="0.2",
        CCLCTL_TRANSPORT=transport,
        CCLCTL_FAULT="slow:rank=3:seq=5:delay=0.01",  # the behaviour: a rank that is slow
    )
    cmd = [sys.executable, "-m", "cclctl", "launch", "-n", "4", "--", sys.executable, str(worker)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    found = {}
    for path in tmp.glob("cclctl-signals-*-rank*.json"):
        snap = snapshot_from_dict(json.loads(path.read_text()), str(path))
        assert snap.finished and snap.signals is not None
        found[snap.rank] = snap.signals
    assert sorted(found) == [0, 1, 2, 3]
    return found


@pytest.mark.timeout(100)
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_the_slow_rank_enters_last_waits_least_and_is_waited_on(
    tmp_path: Path, transport: str
) -> None:
    signals = _run(tmp_path, transport)
    entries: dict[int, dict[int, int]] = {}  # seq -> rank -> entry time
    inside = Counter[int]()
    waited: dict[int, Counter[int]] = {rank: Counter() for rank in signals}
    for rank, sig in signals.items():
        assert sig.window_s == 0.2 and sig.windows
        for window in sig.windows:
            for comm in window.comms.values():
                inside[rank] += comm.inside_ns
                for seq, enter_ns in comm.entries:
                    entries.setdefault(seq, {})[rank] = enter_ns
            for peer, info in window.peers.items():
                assert info.via == ("tcp" if transport == "tcp" else "shm")
                assert info.sent + info.received > 0
                waited[rank][peer] += info.entry_wait_ns
    common = [seq for seq, by in entries.items() if seq >= 5 and len(by) == 4]
    assert len(common) >= 10  # the ranks sampled the same seqs
    last = Counter(max(by, key=by.__getitem__) for by in (entries[s] for s in common))
    assert last.most_common(1)[0][0] == 3 and last[3] >= 0.8 * len(common), last
    assert min(inside, key=inside.__getitem__) == 3, inside
    on_peer = sum(waited.values(), Counter[int]())
    assert on_peer.most_common(1)[0][0] == 3, waited  # the job waits for rank 3 to arrive
    if transport == "auto":  # one host: every rank reads every other's input
        for rank in (0, 1, 2):
            assert waited[rank].most_common(1)[0][0] == 3, waited


TORCH_WORKER = """
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1024)
for _ in range(60):
    if dist.get_rank() == 1:
        time.sleep(0.005)  # the behaviour: a rank slower in its own code (its compute)
    dist.all_reduce(t)
dist.destroy_process_group()
"""


@pytest.mark.timeout(110)
def test_a_torch_job_under_cclctl_run_publishes_its_issue_times(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    worker = tmp_path / "worker.py"
    worker.write_text(TORCH_WORKER)
    here = Path(sys.executable)
    port = free_port_block(2)  # torchrun's, and cclctl's store beside it
    cmd = [
        str(here.with_name("cclctl")), "run", "--", str(here.with_name("torchrun")),
        "--nnodes", "1", "--nproc-per-node", "2", "--master-port", str(port), str(worker),
    ]  # fmt: skip
    env = dict(
        os.environ, CCLCTL_TRACE_DIR=str(tmp_path), CCLCTL_SLOW_WINDOW="0.2", OMP_NUM_THREADS="1"
    )
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-2000:]
    entries: dict[int, dict[int, int]] = {}
    for path in tmp_path.glob("cclctl-*-rank*.json"):
        snap = snapshot_from_dict(json.loads(path.read_text()), str(path))
        assert snap.signals is not None
        for window in snap.signals.windows:
            assert window.peers == {}  # gloo moves the bytes: no peers of cclctl's
            for comm in window.comms.values():
                for seq, enter_ns in comm.entries:
                    entries.setdefault(seq, {})[snap.rank] = enter_ns
    both = [by for by in entries.values() if len(by) == 2]
    assert len(both) >= 20
    late = Counter(max(by, key=by.__getitem__) for by in both)
    assert late[1] >= 0.8 * len(both), late
