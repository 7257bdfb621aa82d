"""Dumps: atomic JSON that round-trips, written on demand, on SIGUSR1 and on error exit,
and only by the process that installed the triggers (never by a fork of it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from telemetry_helpers import T0, run, wait_for

from cclctl.errors import CclError, UsageError
from cclctl.records import FAILED, CollectiveRecord, snapshot_from_json
from cclctl.telemetry import dump_files
from cclctl.telemetry.dump_files import dump_filename


def test_dump_round_trips_through_snapshot_from_json(make_tel, tmp_path):
    tel = make_tel(rank=2, world_size=4, trace_dir=str(tmp_path))
    tel.register_comm("w", [0, 1, 2, 3])
    done = [run(tel, "w", seq, nbytes=64 * seq) for seq in (1, 2, 3)]
    failed = run(tel, "w", 4, state=FAILED)
    failed.error = "peer 3 closed the connection"
    hung = CollectiveRecord("w", 5, "all_reduce", dtype="float32", count=16, nbytes=64)
    hung.start_ns, hung.step, hung.steps = T0 + 10**9, 2, 6
    hung.waiting_on, hung.waiting_for = 3, "recv"
    tel.start(hung)

    path = tel.dump("watchdog: timeout")
    assert path == str(tmp_path / "cclctl-job1-rank2.json")
    snap = snapshot_from_json(Path(path).read_text(), where=path)
    assert snap.kind == "dump" and snap.reason == "watchdog: timeout"
    assert (snap.job, snap.rank, snap.world_size, snap.host) == ("job1", 2, 4, "node-a")
    assert snap.pid == os.getpid()
    assert snap.records == [*done, failed, hung]
    assert snap.inflight == hung
    assert snap.comms["w"].ranks == [0, 1, 2, 3]
    assert (snap.comms["w"].last_started, snap.comms["w"].last_completed) == (5, 3)
    assert snap.counters["collectives"] == 3 and snap.counters["errors"] == 1


def test_without_a_trace_dir_dumps_go_to_the_jobs_private_folder(make_tel, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tel = make_tel()
    folder = tmp_path / f"cclctl-{os.getuid()}" / "job1"
    assert tel.dump_dir == str(folder)
    assert tel.dump("no trace dir") == str(folder / "cclctl-job1-rank0.json")
    assert os.stat(folder).st_mode & 0o777 == 0o700  # stacks and the token live here
    assert os.stat(folder / "cclctl-job1-rank0.json").st_mode & 0o777 == 0o600
    assert snapshot_from_json((folder / "cclctl-job1-rank0.json").read_text()).reason == (
        "no trace dir"
    )
    explicit = tel.dump("asked", str(tmp_path / "mine.json"))
    assert explicit == str(tmp_path / "mine.json") and Path(explicit).exists()
    into_dir = tel.dump("asked", str(tmp_path / "new" / "dir"))
    assert into_dir == str(tmp_path / "new" / "dir" / "cclctl-job1-rank0.json")
    assert snapshot_from_json(Path(into_dir).read_text()).reason == "asked"


def test_the_trace_dir_wins_over_the_jobs_folder(make_tel, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "elsewhere"))
    tel = make_tel(trace_dir=str(tmp_path / "traces"))
    assert tel.dump("x") == str(tmp_path / "traces" / "cclctl-job1-rank0.json")
    assert not (tmp_path / "elsewhere").exists()


def test_dump_replaces_atomically_and_leaves_no_temporary_files(make_tel, tmp_path):
    tel = make_tel(trace_dir=str(tmp_path))
    tel.dump("first")
    run(tel, "w", 1)
    path = tel.dump("second")
    assert os.listdir(tmp_path) == ["cclctl-job1-rank0.json"]
    assert snapshot_from_json(Path(path).read_text()).reason == "second"


def test_a_process_ending_dump_is_never_replaced_by_a_later_one(make_tel, tmp_path):
    """A revocation's dump runs on its own thread and can finish after the excepthook's: the
    process's last word (uncaught, terminated, exit after errors) stays in the file."""
    tel = make_tel(trace_dir=str(tmp_path))
    tel.dump("revoked: link between rank 1 and rank 2 broke")  # before the end: replaced
    path = tel.dump("uncaught CollectiveAborted: aborted by operator")
    tel.dump("revoked: aborted by operator")
    tel.dump("signal SIGUSR1")
    assert snapshot_from_json(Path(path).read_text()).reason == (
        "uncaught CollectiveAborted: aborted by operator"
    )
    tel.dump("exit after errors")  # another ending dump still goes in
    assert snapshot_from_json(Path(path).read_text()).reason == "exit after errors"


@pytest.mark.timeout(30)
def test_dumps_take_turns_so_a_slow_earlier_dump_cannot_overwrite_the_ending_one(
    make_tel, tmp_path, monkeypatch
):
    """The revocation's dump is still writing when the ending dump starts: it waits its turn
    and the ending one, written last, holds the later state."""
    tel = make_tel(trace_dir=str(tmp_path))
    real_write = dump_files.write_atomic
    writing, release = threading.Event(), threading.Event()

    def write_atomic(path: str, data: str) -> None:
        if threading.current_thread().name == "revoke-dump":
            writing.set()
            assert release.wait(20)
        real_write(path, data)

    monkeypatch.setattr(dump_files, "write_atomic", write_atomic)
    revoke = threading.Thread(target=tel.dump, args=("revoked: x",), name="revoke-dump")
    revoke.start()
    assert writing.wait(20)
    ending = threading.Thread(target=tel.dump, args=("uncaught CommRevoked: x",))
    ending.start()
    release.set()
    revoke.join(20)
    ending.join(20)
    path = tmp_path / "cclctl-job1-rank0.json"
    assert snapshot_from_json(path.read_text()).reason == "uncaught CommRevoked: x"


def test_unwritable_dump_raises_a_one_line_typed_error(make_tel, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    tel = make_tel(trace_dir=str(blocker / "sub"))
    with pytest.raises(CclError) as err:
        tel.dump("x")
    assert "cannot write dump" in str(err.value) and "\n" not in str(err.value)


def test_dump_file_names_are_safe():
    assert dump_filename("train/run 7", 3) == "cclctl-train_run_7-rank3.json"
    assert dump_filename("", 0) == "cclctl-job-rank0.json"


@pytest.mark.timeout(10)
def test_signal_handler_only_from_the_main_thread(make_tel):
    tel = make_tel()
    errors: list[Exception] = []

    def install() -> None:
        try:
            tel.install_signal_dump()
        except UsageError as exc:
            errors.append(exc)

    worker = threading.Thread(target=install)
    worker.start()
    worker.join(5)
    assert len(errors) == 1 and "main thread" in str(errors[0])


_SIGNAL_CHILD = """
import signal, sys, time
from cclctl.config import RuntimeConfig
from cclctl.records import CollectiveRecord
from cclctl.telemetry.hub import Telemetry

chained = []
signal.signal(signal.SIGUSR1, lambda s, f: chained.append(s))
tel = Telemetry(RuntimeConfig(job="sig", trace_dir=sys.argv[1]), rank=1, world_size=2)
tel.register_comm("w", [0, 1])
rec = CollectiveRecord("w", 9, "all_gather", start_ns=time.time_ns(), waiting_on=0)
tel.start(rec)
tel.install_signal_dump()
print("ready", flush=True)
deadline = time.monotonic() + 20
while not chained and time.monotonic() < deadline:
    time.sleep(0.01)
print("chained" if chained else "not chained", flush=True)
"""


@pytest.mark.timeout(30)
def test_sigusr1_dumps_a_running_process_and_chains_the_old_handler(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(_SIGNAL_CHILD))
    with subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            os.kill(proc.pid, signal.SIGUSR1)
            out, _ = proc.communicate(timeout=20)
        finally:
            proc.kill()
    assert proc.returncode == 0 and out.strip() == "chained"
    path = tmp_path / "cclctl-sig-rank1.json"
    wait_for(path.exists)
    snap = snapshot_from_json(path.read_text())
    assert snap.reason == "signal SIGUSR1" and snap.pid == proc.pid
    assert snap.inflight is not None and (snap.inflight.seq, snap.inflight.waiting_on) == (9, 0)


_EXIT_CHILD = """
import sys, time
from cclctl.config import RuntimeConfig
from cclctl.records import CollectiveRecord
from cclctl.telemetry.hub import Telemetry

tel = Telemetry(RuntimeConfig(job="exit", trace_dir=sys.argv[1]), rank=0, world_size=2)
tel.install_exit_dump()
rec = CollectiveRecord("w", 1, "all_reduce", start_ns=time.time_ns())
tel.start(rec)
rec.state, rec.end_ns = "failed", rec.start_ns + 1
tel.close()  # a finally that closes telemetry must not disarm the exit dump
if sys.argv[2] == "raise":
    raise RuntimeError("peer 1 vanished")
"""


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("mode", "reason", "code"),
    [("raise", "uncaught RuntimeError: peer 1 vanished", 1), ("exit", "exit after errors", 0)],
)
def test_exit_after_errors_leaves_a_dump(tmp_path, mode, reason, code):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(_EXIT_CHILD))
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), mode],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert proc.returncode == code
    if mode == "raise":
        assert "RuntimeError: peer 1 vanished" in proc.stderr  # the old excepthook still ran
    snap = snapshot_from_json((tmp_path / "cclctl-exit-rank0.json").read_text())
    assert snap.reason == reason
    assert snap.counters["errors"] == 1 and snap.records[0].state == "failed"


@pytest.mark.timeout(30)
def test_clean_exit_writes_no_dump(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(_EXIT_CHILD).replace('"failed"', '"completed"'))
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "exit"], capture_output=True, timeout=20
    )
    assert proc.returncode == 0
    assert not (tmp_path / "cclctl-exit-rank0.json").exists()


_FORK_CHILD = """
import json, os, signal, sys, threading, time
from cclctl.config import RuntimeConfig
from cclctl.records import CollectiveRecord
from cclctl.telemetry.hub import Telemetry

directory, mode, hold = sys.argv[1], sys.argv[2], sys.argv[3] == "hold"
path = os.path.join(directory, "cclctl-fork-rank3.json")
tel = Telemetry(RuntimeConfig(job="fork", trace_dir=directory), rank=3, world_size=4)
rec = CollectiveRecord("w", 1, "all_reduce", start_ns=time.time_ns())
tel.start(rec)
rec.state, rec.end_ns = "failed", rec.start_ns + 1
tel.install_signal_dump()
tel.install_termination_dump()
tel.install_exit_dump()
held, release = threading.Event(), threading.Event()
if hold:  # a fold thread inside the recorder's lock when the process forks

    def fold():
        with tel.recorder._lock:
            held.set()
            release.wait()

    threading.Thread(target=fold, daemon=True).start()
    held.wait()
started_r, started_w = os.pipe()
pid = os.fork()
if pid == 0:  # the forked child (a DataLoader worker, say): inherits every trigger
    if mode == "signal":
        os.kill(os.getpid(), signal.SIGUSR1)  # the Python handler has run when kill returns
        for thread in threading.enumerate():  # a fork keeps no thread: any is the handler's
            if thread is not threading.current_thread():
                thread.join(5)
        sys.exit(0)  # a normal exit: atexit runs
    if mode == "raise":
        raise RuntimeError("worker failed")
    os.write(started_w, b"x")  # "term": running, past the fork; the parent stops it
    time.sleep(60)  # past the parent's deadline: a lost SIGTERM shows as "hung"
    os._exit(0)
os.close(started_w)
release.set()
if mode == "term":
    os.read(started_r, 1)  # the child runs (or has died: then the read ends at once)
    os.kill(pid, signal.SIGTERM)
deadline = time.monotonic() + 25  # generous: a loaded 2-core CI machine starves a child
while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
    time.sleep(0.02)
if done == (0, 0):
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    child = "hung"
elif os.WIFSIGNALED(done[1]):
    child = f"signal {os.WTERMSIG(done[1])}"
else:
    child = f"exit {os.WEXITSTATUS(done[1])}"
print(json.dumps({"child": child, "dumped": os.path.exists(path), "pid": os.getpid()}))
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("mode", "hold", "ends"),
    [
        ("signal", "hold", "exit 0"),
        ("signal", "free", "exit 0"),
        ("raise", "hold", "exit 1"),
        ("raise", "free", "exit 1"),
        ("term", "free", f"signal {int(signal.SIGTERM)}"),
    ],
)
def test_a_forked_child_never_dumps_the_ranks_recorder(tmp_path, mode, hold, ends):
    """A fork inherits the triggers and a frozen copy of the rank's recorder: dumping it
    would hang on a lock held at the fork, or write stale evidence under the rank's name.
    The rank itself still dumps at its own exit."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(_FORK_CHILD))
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), mode, hold],
        capture_output=True,
        text=True,
        timeout=45,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert (seen["child"], seen["dumped"]) == (ends, False)
    snap = snapshot_from_json((tmp_path / "cclctl-fork-rank3.json").read_text())
    assert snap.reason == "exit after errors" and snap.pid == seen["pid"]
