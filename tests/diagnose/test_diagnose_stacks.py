"""Stacks in verdicts: one line naming the user's frame, the whole stack in --json and
--stacks; py-spy only for a live running process; a folder of cclctl and Flight Recorder
dumps read together; and a reader that closes stdout early keeps the verdict's exit code.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from diagnose_factory import Job, ring_left

from cclctl.diagnose.engine import diagnose
from cclctl.diagnose.stacks import frame_kind, one_line
from cclctl.records import STARTED, CollectiveRecord, CommInfo, RankSnapshot, snapshot_from_json
from cclctl.stack_records import Frame, ThreadStack
from scripts import script

EXIT_FAULT = 3
WORKER = Path(script("stuck_rank.py"))
SLEEP_LINE = next(i for i, line in enumerate(WORKER.read_text().splitlines(), 1)
                  if "time.sleep(120)" in line)  # fmt: skip


def hang(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "cclctl", "diagnose", "hang", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def stack(*frames: tuple[str, int, str, str]) -> ThreadStack:
    return ThreadStack("MainThread", tuple(Frame(*f) for f in frames), main=True)


# -- the one line ------------------------------------------------------------------------------


def test_one_line_names_the_innermost_user_frame_and_its_call():
    lib = "/usr/lib/python3.11/threading.py"
    s = stack(("/job/train.py", 60, "main", "load_batch(i)"),
              ("/job/train.py", 41, "load_batch", "item = self.queue.get(timeout=5)"),
              ("/usr/lib/python3.11/queue.py", 180, "Queue.get", "self.not_empty.wait(r)"),
              (lib, 355, "Condition.wait", "waiter.acquire()"))  # fmt: skip
    assert one_line(s) == (
        "train.py:41 load_batch -> self.queue.get -> threading.py:355 Condition.wait"
    )
    sleeping = stack(("/job/train.py", 41, "load_batch", "time.sleep(3600)"))
    assert one_line(sleeping) == "train.py:41 load_batch -> time.sleep"
    inside = stack(("/job/train.py", 30, "step", "comm.all_reduce(x)"),
                   ("/site/cclctl/runtime/communicator.py", 90, "Communicator.all_reduce", ""),
                   ("/site/cclctl/runtime/shm_group.py", 120, "wait", ""))  # fmt: skip
    assert one_line(inside) == "train.py:30 step -> comm.all_reduce -> shm_group.py:120 wait"


def test_frames_are_classified_by_path():
    assert frame_kind("/usr/lib/python3.11/threading.py") == "stdlib"
    assert frame_kind("<frozen importlib._bootstrap>") == "stdlib"
    assert frame_kind("/venv/lib/python3.11/site-packages/torch/distributed/c10d.py") == "library"
    assert frame_kind("/venv/lib/python3.11/site-packages/cclctl/runtime/tcp.py") == "cclctl"
    assert frame_kind("/home/me/cclctl/tests/train.py") == "user"  # a repo named cclctl


# -- next steps ------------------------------------------------------------------------------


def behind() -> Job:
    job = Job(4).enter([0, 1, 2], waiting_on=ring_left(4))
    return job.stack(3, ("/job/train.py", 41, "load_batch", "time.sleep(3600)"))


def test_py_spy_only_for_a_live_running_process():
    job = behind()
    post_mortem = diagnose(job.snapshots())
    assert "py-spy" not in post_mortem.verdicts[0].next_step
    assert post_mortem.verdicts[0].where == ["rank 3 is in train.py:41 load_batch -> time.sleep"]
    still_running = diagnose(job.snapshots(), proc={3: "running"})  # dumps, process alive
    assert "py-spy" not in still_running.verdicts[0].next_step
    live = diagnose(job.snapshots("status"), now_ns=job.t0, proc={3: "running"})
    assert live.verdicts[0].next_step.startswith("`py-spy dump --pid 1003` on host-0 (rank 3)")
    gone = diagnose(job.snapshots("status"), now_ns=job.t0, proc={3: "gone"})
    assert [v.kind for v in gone.verdicts] == ["dead"]
    assert "py-spy" not in json.dumps(gone.to_dict())


# -- a real rank, stuck in a named function ----------------------------------------------------


@pytest.fixture
def stuck_rank(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, str(WORKER), str(tmp_path)], stdout=subprocess.PIPE,
                            text=True, env=env)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        _until_asleep(proc.pid)
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _until_asleep(pid: int) -> None:
    """Return once the main thread blocks in its sleep: a signal sent after "ready" but
    before ``time.sleep`` would interrupt another line."""
    wchan = Path(f"/proc/{pid}/wchan")
    deadline = time.monotonic() + 30
    while "nanosleep" not in wchan.read_text():
        assert time.monotonic() < deadline, f"rank never slept: {wchan.read_text()!r}"
        time.sleep(0.01)


def dump_of(proc: subprocess.Popen[str], folder: Path, signum: int = signal.SIGUSR1) -> Path:
    path = folder / "cclctl-stuck-rank1.json"
    proc.send_signal(signum)
    deadline = time.monotonic() + 30
    while not path.exists():  # the dump is renamed into place whole
        assert time.monotonic() < deadline, "no dump after SIGUSR1"
        time.sleep(0.02)
    return path


def write_rank0(folder: Path) -> None:
    """Rank 0 waits in all_reduce seq 4 for rank 1, for 30 s (on another host)."""
    now = time.time_ns()
    rec = CollectiveRecord("0:0-1", 4, "all_reduce", dtype="float32", count=8, nbytes=32,
                           state=STARTED, start_ns=now - 30 * 10**9, waiting_on=1,
                           waiting_for="recv")  # fmt: skip
    snap = RankSnapshot("dump", "stuck", 0, 2, "other-host", 4242, now,
                        {"0:0-1": CommInfo([0, 1], 4, 3)}, [rec], rec, "watchdog")  # fmt: skip
    (folder / "cclctl-stuck-rank0.json").write_text(snap.to_json())


@pytest.mark.timeout(90)
def test_a_real_rank_stuck_in_load_batch_is_named_in_the_verdict(stuck_rank, tmp_path: Path):
    path = dump_of(stuck_rank, tmp_path)
    dumped = snapshot_from_json(path.read_text(), where=str(path))
    main = next(s for s in dumped.stacks if s.main)
    assert [f.func for f in main.frames] == ["<module>", "main", "load_batch"]  # not the handler
    write_rank0(tmp_path)
    expected = f"   stack: rank 1 is in stuck_rank.py:{SLEEP_LINE} load_batch -> time.sleep"
    alive = hang(str(tmp_path))
    assert alive.returncode == EXIT_FAULT, alive.stderr
    assert "1. NOT ENTERED  rank 1 never entered all_reduce seq 4 of comm 0:0-1" in alive.stdout
    assert any(line.startswith(expected) for line in alive.stdout.splitlines()), alive.stdout
    assert "py-spy" not in alive.stdout  # post-mortem: the dump's stack, not py-spy
    stuck_rank.kill()
    stuck_rank.wait(timeout=30)
    exited = hang("--json", str(tmp_path))
    assert exited.returncode == EXIT_FAULT, exited.stderr
    assert "py-spy" not in exited.stdout
    (verdict,) = json.loads(exited.stdout)["verdicts"]
    assert verdict["where"][0].startswith(f"rank 1 is in stuck_rank.py:{SLEEP_LINE} load_batch")
    frames = verdict["stacks"]["1"][0]["frames"]
    assert frames[2] == {"file": str(WORKER), "line": SLEEP_LINE, "func": "load_batch",
                         "code": "time.sleep(120)  # the line the verdict names: load_batch -> "
                                 "time.sleep"}  # fmt: skip
    full = hang("--stacks", str(tmp_path))
    assert f'File "{WORKER}", line {SLEEP_LINE}, in load_batch' in full.stdout


@pytest.mark.timeout(60)
def test_a_termination_dump_shows_where_the_handler_interrupted_the_rank(stuck_rank, tmp_path):
    path = dump_of(stuck_rank, tmp_path, signal.SIGTERM)
    assert stuck_rank.wait(timeout=30) == -signal.SIGTERM  # it still dies of the signal
    main = next(s for s in snapshot_from_json(path.read_text()).stacks if s.main)
    assert [f.func for f in main.frames] == ["<module>", "main", "load_batch"]
    assert main.frames[-1].line == SLEEP_LINE


# -- cclctl dumps and Flight Recorder dumps in one folder --------------------------------------


def fr_entry(seq: int, done: bool) -> dict[str, Any]:
    frames = [{"name": "all_reduce", "filename": "/venv/lib/python3.11/site-packages/torch/"
               "distributed/distributed_c10d.py", "line": 3245},
              {"name": "step", "filename": "/job/train.py", "line": 52},
              {"name": "<module>", "filename": "/job/train.py", "line": 70}]  # fmt: skip
    return {
        "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
        "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:all_reduce",
        "time_created_ns": 1_700_000_000_000_000_000 + seq, "input_sizes": [[1024]],
        "input_dtypes": ["Float"], "output_sizes": [[1024]], "output_dtypes": ["Float"],
        "state": "completed" if done else "started", "retired": done, "is_p2p": False,
        "frames": frames,
    }  # fmt: skip


def write_fr(folder: Path, rank: int, entries: list[dict[str, Any]]) -> None:
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}
    doc = {"version": "2.10", "pg_config": config, "pg_status": {}, "entries": entries}
    (folder / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(doc, protocol=2))


@pytest.mark.timeout(60)
def test_a_mixed_folder_reads_both_kinds_merged_by_rank(tmp_path: Path):
    job = Job(4, job="train7").enter([0, 1, 2], waiting_on=ring_left(4))
    for snap in job.snapshots(without=[3]):  # rank 3 left no cclctl dump ...
        (tmp_path / f"cclctl-train7-rank{snap.rank}.json").write_text(snap.to_json())
    done = [fr_entry(seq, True) for seq in range(1, 11)]
    write_fr(tmp_path, 3, done)  # ... but a Flight Recorder dump: it completed seq 10
    write_fr(tmp_path, 0, [*done, fr_entry(11, False)])
    out = hang("--json", str(tmp_path))
    assert out.returncode == EXIT_FAULT, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["job"], doc["ranks_seen"]) == ("train7", 4)
    assert doc["verdicts"][0]["summary"] == "rank 3 never entered all_reduce seq 11 of comm 0:0-3"
    assert "rank 3: only a Flight Recorder dump (no host or pid known)" in doc["notes"]
    assert doc["notes"][0] == "read 3 cclctl and 2 Flight Recorder dumps as job 'train7'"
    assert doc["verdicts"][0]["where"] == [
        "rank 3 called all_reduce seq 10 of comm 0:0-3 from train.py:52 step -> "
        "distributed_c10d.py:3245 all_reduce (Flight Recorder)"
    ]
    alone = hang(str(tmp_path / "cclctl-train7-rank0.json"), str(tmp_path / "nccl_trace_rank_3"))
    assert alone.returncode == EXIT_FAULT and "ranks 1-2 left no dump" in alone.stdout


# -- a reader that leaves early ----------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("as_json", [False, True])
def test_a_closed_stdout_keeps_the_verdicts_exit_code(tmp_path: Path, as_json: bool):
    job = behind()
    for snap in job.snapshots():
        (tmp_path / f"cclctl-j1-rank{snap.rank}.json").write_text(snap.to_json())
    cmd = [sys.executable, "-m", "cclctl", "diagnose", "hang", str(tmp_path), "--stacks"]
    proc = subprocess.Popen(cmd + (["--json"] if as_json else []), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first byte is written
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == EXIT_FAULT
    assert err == (
        "cclctl: error: fault found: rank 3 never entered all_reduce seq 11 of comm 0:0-3\n"
    )


@pytest.mark.timeout(60)
def test_head_keeps_exit_3_and_stderr_clean(tmp_path: Path):
    for snap in behind().snapshots():
        (tmp_path / f"cclctl-j1-rank{snap.rank}.json").write_text(snap.to_json())
    script = (f"set -o pipefail; {sys.executable} -m cclctl diagnose hang {tmp_path} | head -1;"
              " s=(${PIPESTATUS[@]}); echo ${s[@]} >&2; exit ${s[0]}")  # fmt: skip
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout == "job j1 · dumps of 4/4 ranks · 1 finding\n"
    assert out.stderr.splitlines() == [
        "cclctl: error: fault found: rank 3 never entered all_reduce seq 11 of comm 0:0-3",
        "3 0",
    ]
    assert out.returncode == EXIT_FAULT


@pytest.mark.timeout(60)
def test_every_command_ends_quietly_on_a_closed_stdout():
    proc = subprocess.Popen([sys.executable, "-m", "cclctl", "diagnose", "hang", "--help"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 1 and err == ""  # as the Python docs advise
