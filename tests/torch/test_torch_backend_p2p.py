"""Point-to-point calls on the ``cclctl`` backend: each peer and direction has its own lane,
so two ranks that each ``isend`` before their ``irecv`` (pipeline parallelism's pattern)
exchange messages far beyond the links' buffering, ``batch_isend_irecv`` rings go round,
the data arrive exact and the records keep the runtime's per-pair seq (backend_p2p_job.py,
under torchrun). Plus the lanes in this process (progress.py): their order, and a call
torch waits on at once run on the caller's thread.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from torch_jobs import HERE, TORCHRUN, child_env, free_port

from cclctl.integrations.torch.backend.progress import Progress
from cclctl.integrations.torch.backend.work import CclctlWork


def _torchrun(world: int, out: Path, transport: str) -> None:
    if not Path(TORCHRUN).exists():
        pytest.skip("torchrun is not installed next to this Python")
    cmd = [TORCHRUN, "--nnodes", "1", "--nproc-per-node", str(world), "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), str(HERE / "backend_p2p_job.py"),
           str(out)]  # fmt: skip
    env = dict(os.environ, **child_env(CCLCTL_TIMEOUT="60", CCLCTL_TRANSPORT=transport))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=170, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def _expected_records(rank: int, world: int) -> list[list[Any]]:
    """Each rank's sends and recvs: the pair's at seq 1 and 2 (4 and 16 MiB), then the
    ring's (the next seq of that pair, or 1 where the ring's peer is another rank)."""
    seqs: dict[tuple[str, int], int] = {}
    records = []

    def add(op: str, peer: int, nbytes: int) -> None:
        seqs[op, peer] = seqs.get((op, peer), 0) + 1
        records.append([op, peer, seqs[op, peer], "completed", nbytes])

    if rank ^ 1 < world:
        for mib in (4, 16):
            add("send", rank ^ 1, mib << 20)
            add("recv", rank ^ 1, mib << 20)
    add("send", (rank + 1) % world, 4 << 20)
    add("recv", (rank - 1) % world, 4 << 20)
    return sorted(records)


@pytest.mark.slow  # torchrun and torch's import on every rank: 10-40 s under load
@pytest.mark.timeout(200)
@pytest.mark.parametrize(("world", "transport"), [(2, "auto"), (4, "auto"), (2, "tcp")])
def test_isend_before_irecv_on_both_sides_and_a_batched_ring_exchange_exactly(
    world: int, transport: str, tmp_path: Path
) -> None:
    """auto: shared memory (one host); over TCP too, where a send and a receive with one
    peer share its one socket."""
    _torchrun(world, tmp_path, transport)
    for rank in range(world):
        doc = json.loads((tmp_path / f"rank{rank}.json").read_text())
        pairs = {f"pair/{m}MiB" for m in (4, 16)} if rank ^ 1 < world else set()
        assert set(doc["exact"]) == pairs | {"ring/4MiB", "all_reduce"}
        assert all(doc["exact"].values()), (rank, doc["exact"])
        assert doc["p2p"] == _expected_records(rank, world)


# ------------------------------------------------------------------------ in this process
def test_a_blocked_send_lane_does_not_hold_up_a_receive_issued_after_it() -> None:
    """A send that waits for its receiver (here: for the receive's job to run) ends once a
    receive issued after it, on another lane, ran: on one thread both would wait forever."""
    progress = Progress("test")
    received = threading.Event()
    try:
        send = progress.submit(lambda: [] if received.wait(30) else 1 / 0, ("send", 1))
        recv = progress.submit(lambda: received.set() or [], ("recv", 1))
        CclctlWork(recv, "recv", progress).wait()
        assert CclctlWork(send, "send", progress).wait()
        assert send.done and send.error is None and not send.result
    finally:
        progress.close()


def test_calls_of_one_pair_and_direction_keep_their_order() -> None:
    progress = Progress("test")
    seen: list[int] = []
    try:
        entries = [progress.submit(lambda i=i: seen.append(i) or [], ("send", 1))
                   for i in range(20)]  # fmt: skip
        CclctlWork(entries[-1], "send", progress).wait()
        assert seen == list(range(20))
    finally:
        progress.close()


def test_a_collective_runs_after_the_point_to_point_calls_issued_before_it() -> None:
    """... and a point-to-point call after the collective before it: they never overlap."""
    progress = Progress("test")
    release = threading.Event()
    seen: list[str] = []
    try:
        first = progress.submit(lambda: [] if release.wait(30) and not seen.append("a") else 1 / 0)
        send = progress.submit(lambda: seen.append("s") or [], ("send", 1))
        coll = progress.submit(lambda: seen.append("c") or [])
        recv = progress.submit(lambda: seen.append("r") or [], ("recv", 1))
        assert not progress.run_here(send) and not progress.run_here(recv)
        assert not (first.done or send.done or coll.done or recv.done)
        release.set()
        CclctlWork(recv, "recv", progress).wait()
        assert seen == ["a", "s", "c", "r"]
    finally:
        progress.close()


def test_a_call_waited_on_at_once_runs_on_the_callers_thread_when_nothing_is_before_it() -> None:
    """torch's ``async_op=False`` (``now``): no handoff, the lane's thread is not woken; an
    error stays the call's, raised by ``wait()``."""
    progress = Progress("test")
    where: list[str] = []
    release = threading.Event()
    try:
        entry = progress.submit(lambda: where.append(threading.current_thread().name) or [],
                                now=True)  # fmt: skip
        assert entry.done and where == [threading.current_thread().name]
        failing = progress.submit(_raise, now=True)
        with pytest.raises(ZeroDivisionError):
            CclctlWork(failing, "c", progress).wait()
        blocked = progress.submit(lambda: [] if release.wait(30) else 1 / 0)
        queued = progress.submit(lambda: where.append("after") or [], now=True)
        assert not queued.done  # an earlier call still runs: queued behind it, in order
        release.set()
        CclctlWork(queued, "c", progress).wait()
        assert blocked.done and where[-1] == "after"
        future = CclctlWork(entry, "c", progress).get_future()
        assert future.done() and future.value() == []
    finally:
        progress.close()


def _raise() -> list[Any]:
    raise ZeroDivisionError("the call's own error")
