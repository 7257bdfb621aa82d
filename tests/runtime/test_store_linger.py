"""The store rank 0 hosts outlives rank 0, and lingers no longer than its grace.

Real env-launched jobs (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as srun or mpirun start
ranks), real store processes; every wait polls with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_job import TOKEN, WORKER, FaultJob, free_port
from processes import gone, until

from cclctl.store.client import StoreClient
from cclctl.store.linger import ENDED_KEY

JOB = "lingering"
REPORT_KEY = f"cclctl/{JOB}/store/process"


def marked_ended(store: str) -> bool:
    """Whether the store has seen its last rank leave and marked itself ended (a reader's
    connection is no member: asking does not change the answer)."""
    with StoreClient.from_address(store, timeout_s=5, connect_timeout_s=10, token=TOKEN) as c:
        return c.try_get(ENDED_KEY) is not None


def store_report(store: str) -> dict[str, object]:
    """What the job's store process says about itself (read with the job's token, by LIST
    alone: a connection with the token that gets a key counts as a rank's, and its close,
    before the job's rank 0 connected, would be the job's end to the store)."""
    with StoreClient.from_address(store, timeout_s=5, connect_timeout_s=10, token=TOKEN) as c:
        deadline = time.monotonic() + 10
        while (raw := c.list(REPORT_KEY).get(REPORT_KEY)) is None:
            assert time.monotonic() < deadline, "the store never published its report"
            time.sleep(0.05)
        return dict(json.loads(raw))


def cclctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cclctl", *args], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def store_pids() -> Iterator[list[int]]:
    """Store processes a test found; any still running at the end is a failure, then killed."""
    pids: list[int] = []
    yield pids
    left = [pid for pid in pids if not gone(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"store processes outlived the test: {left}"


@pytest.mark.timeout(120)
def test_the_store_answers_after_rank0_is_killed_and_exits_its_grace_after_the_last_rank(
    tmp_path: Path, store_pids: list[int]
) -> None:
    job = FaultJob(tmp_path, 4, fault="kill:rank=0:seq=3", job=JOB, rank0_hosts=True, linger_s=10)
    try:
        pid = int(str(store_report(job.store)["pid"]))
        store_pids.append(pid)
        assert pid not in [p.pid for p in job.procs]  # a process of its own
        until("rank 0 killed", lambda: job.procs[0].poll() is not None, 60)
        assert job.procs[0].returncode == -signal.SIGKILL

        live = cclctl("diagnose", "hang", "--store", job.store, "--job", JOB)
        assert live.returncode == 3, live.stdout + live.stderr  # a fault found, not "no store"
        assert "rank 0 is dead" in live.stdout
        assert "cannot reach" not in live.stderr
    finally:
        job.finish()  # the survivors leave: now no rank is left
    assert not gone(pid)  # it lingers for the post-mortem
    top = cclctl("top", "--once", "--store", job.store, "--job", JOB)
    assert top.returncode == 0, top.stdout + top.stderr
    assert f"job {JOB}" in top.stdout and "4/4 ranks" in top.stdout
    until("the store gone", lambda: gone(pid), 10 + 30)
    log = (job.dump_dir / "store.log").read_text()
    assert "no rank for 10s, exiting" in log


@pytest.mark.timeout(120)
def test_a_clean_jobs_store_exits_after_its_grace(tmp_path: Path, store_pids: list[int]) -> None:
    job = FaultJob(tmp_path, 4, iters=2, pause_s=0.05, job=JOB, rank0_hosts=True, linger_s=1)
    try:
        pid = int(str(store_report(job.store)["pid"]))
        store_pids.append(pid)
        assert job.wait_all_exited(60) == [0, 0, 0, 0]
    finally:
        job.finish()
    until("the store gone", lambda: gone(pid), 1 + 30)


@pytest.mark.timeout(120)
def test_rank0_dying_before_the_others_connect_leaves_no_orphan(
    tmp_path: Path, store_pids: list[int]
) -> None:
    job = FaultJob(tmp_path, 4, job=JOB, rank0_hosts=True, linger_s=1, ranks=[0])
    try:
        report = store_report(job.store)  # rank 0 waits in rendezvous for ranks 1-3
        pid = int(str(report["pid"]))
        store_pids.append(pid)
        job.procs[0].send_signal(signal.SIGKILL)
        job.procs[0].wait(10)
    finally:
        job.finish()
    until("the store gone", lambda: gone(pid), 1 + 30)


@pytest.mark.timeout(120)
def test_capturing_a_jobs_output_does_not_wait_for_its_store(
    tmp_path: Path, store_pids: list[int]
) -> None:
    """``subprocess.run(capture_output=True)`` of a whole job returns when its ranks do,
    though the store lingers (600 s here): the store holds none of the job's pipes."""
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    env |= {
        "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
        "CCLCTL_JOB": JOB, "CCLCTL_TOKEN": TOKEN, "CCLCTL_STORE_LINGER": "600",
        "CCLCTL_TRACE_DIR": str(tmp_path), "ITERS": "1", "PAUSE": "0",
    }  # fmt: skip
    script = f"RANK=0 {sys.executable} {WORKER} & RANK=1 {sys.executable} {WORKER} & wait"
    ran = subprocess.run(["bash", "-c", script], env=env, capture_output=True, timeout=90)
    assert ran.returncode == 0, ran.stderr
    assert b"rank 0 done" in ran.stdout and b"rank 1 done" in ran.stdout
    pid = int(str(store_report(f"127.0.0.1:{port}")["pid"]))
    store_pids.append(pid)
    assert not gone(pid)  # still lingering: the run above did not wait for it
    os.kill(pid, signal.SIGTERM)
    until("the store gone", lambda: gone(pid), 30)


def rank0_error(job: FaultJob) -> str:
    """The stderr of the job's first process, once it exited (it failed to start)."""
    proc = job.procs[0]
    proc.wait(60)
    assert proc.returncode != 0 and proc.stderr is not None
    return proc.stderr.read().decode(errors="replace")


def ended_run(tmp_path: Path, store_pids: list[int]) -> tuple[FaultJob, int]:
    """A 2-rank run that ended cleanly, and the pid of its store, lingering (600 s)."""
    first = FaultJob(tmp_path, 2, iters=2, pause_s=0.05, job=JOB, rank0_hosts=True,
                     linger_s=600, dump_dir=tmp_path / "first")  # fmt: skip
    try:
        old = int(str(store_report(first.store)["pid"]))
        store_pids.append(old)
        assert first.wait_all_exited(60) == [0, 0]
        # The store learns that its ranks left from their connections' ends, on its own
        # loop: a rerun is "after the run ended" once it has (a loaded machine can lag).
        until("the first run's store marked itself ended", lambda: marked_ended(first.store), 30)
    finally:
        first.finish()
    return first, old


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("name", "folder"), [(JOB, "first"), (f"{JOB}-rerun", "rerun")])
def test_a_rerun_on_the_fixed_port_of_a_lingering_store_starts(
    tmp_path: Path, store_pids: list[int], name: str, folder: str
) -> None:
    """A job, then a rerun (the same job, or another name in a folder beside it) on its
    MASTER_PORT while its store lingers (600 s): the old store leaves (no rank of its job
    uses it; the rerun's rank 1 waits past it), the rerun's rank 0 binds, the rerun runs."""
    first, old = ended_run(tmp_path, store_pids)
    assert not gone(old)  # lingering, on the port
    rerun = FaultJob(tmp_path, 2, iters=2, pause_s=0.05, job=name, rank0_hosts=True,
                     linger_s=600, port=first.port, dump_dir=tmp_path / folder)  # fmt: skip
    try:
        assert rerun.wait_all_exited(60)[0] == 0, rank0_error(rerun)
        assert rerun.wait_all_exited(60) == [0, 0]
    finally:
        rerun.finish()
    until("the old store gone", lambda: gone(old), 30)
    log = (first.dump_dir / "store.log").read_text()
    assert "asked to leave, no rank of its job connected" in log
    new = json.loads((rerun.dump_dir / f"store-{first.port}.pid").read_text())
    assert new["job"] == name and new["pid"] != old
    store_pids.append(int(new["pid"]))
    os.kill(int(new["pid"]), signal.SIGUSR1)  # the rerun's store leaves the same way
    until("the rerun's store gone", lambda: gone(int(new["pid"])), 30)


@pytest.mark.timeout(120)
def test_a_rerun_rank_never_joins_the_ended_store_its_rank0_did_not_replace(
    tmp_path: Path, store_pids: list[int]
) -> None:
    """A rerun's rank 1 reaches the lingering store of the run before, whose claims are that
    run's; with no rank 0 of its own to replace it, it waits out its connect timeout and
    fails naming that store, instead of claiming a rank there."""
    first, old = ended_run(tmp_path, store_pids)
    alone = FaultJob(tmp_path, 2, iters=2, job=JOB, rank0_hosts=True, port=first.port,
                     ranks=[1], dump_dir=tmp_path / "alone",
                     extra={"CCLCTL_CONNECT_TIMEOUT": "2"})  # fmt: skip
    try:
        error = alone.errors([0])[0]
    finally:
        alone.finish()
    assert alone.procs[0].returncode != 0
    assert f"the store on {first.store} belongs to a run that ended" in error, error
    assert "rank 0 did not replace it within 2s" in error
    assert "claimed twice" not in error
    assert not gone(old)  # untouched: nobody asked it to leave
    os.kill(old, signal.SIGUSR1)
    until("the old store gone", lambda: gone(old), 30)


@pytest.mark.timeout(120)
def test_a_second_job_on_the_port_of_a_running_job_fails_naming_it(
    tmp_path: Path, store_pids: list[int]
) -> None:
    running = FaultJob(tmp_path, 2, job=JOB, rank0_hosts=True, linger_s=1, ranks=[0])
    try:
        pid = int(str(store_report(running.store)["pid"]))  # rank 0 waits for rank 1
        store_pids.append(pid)
        second = FaultJob(tmp_path, 2, job="intruder", rank0_hosts=True, port=running.port,
                          ranks=[0], dump_dir=tmp_path / "intruder")  # fmt: skip
        try:
            error = rank0_error(second)
        finally:
            second.finish()
        assert f"the port is held by the store of job {JOB!r} (pid {pid})" in error
        assert "1 of its ranks are still connected" in error
        assert "never taken away" in error
        assert not gone(pid) and running.procs[0].poll() is None  # the running job is intact
        store_report(running.store)  # and its store answers
    finally:
        running.finish()
    until("the store gone", lambda: gone(pid), 1 + 30)


LISTENER = """
import socket, sys
with socket.create_server(("127.0.0.1", int(sys.argv[1]))):
    print("listening", flush=True)
    sys.stdin.read()
"""


@pytest.mark.timeout(120)
def test_a_port_held_by_a_process_that_is_no_store_is_left_alone(tmp_path: Path) -> None:
    """A pid file naming the process that listens on the port is not enough: it does not
    run the store, so it is never signalled, and the rerun fails as the bind did."""
    port = free_port()
    holder = subprocess.Popen([sys.executable, "-c", LISTENER, str(port)], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "listening\n"
        folder = tmp_path / "dumps"
        folder.mkdir()
        (folder / f"store-{port}.pid").write_text(json.dumps({"pid": holder.pid, "port": port}))
        job = FaultJob(tmp_path, 2, job=JOB, rank0_hosts=True, port=port, ranks=[0])
        try:
            error = rank0_error(job)
        finally:
            job.finish()
        assert "Address already in use" in error
        assert "no lingering cclctl store of yours was found on it" in error
        assert holder.poll() is None  # never signalled
    finally:
        holder.kill()
        holder.wait(10)
