"""`cclctl diagnose hang` run as a subprocess, as an SRE runs it: dumps in folders, a live job
in a real store, real processes stopped and gone, and every way input can be unusable.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from diagnose_factory import Job, ring_left

from cclctl.store.client import StoreClient, StoreServer

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_FAULT = 0, 1, 2, 3


def hang(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "cclctl", "diagnose", "hang", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def write_dumps(directory: Path, job: Job, without: tuple[int, ...] = ()) -> list[Path]:
    paths = []
    for snap in job.snapshots(without=without):
        path = directory / f"cclctl-{snap.job}-rank{snap.rank}.json"
        path.write_text(snap.to_json())
        paths.append(path)
    return paths


def rank3_behind() -> Job:
    return Job(4).enter([0, 1, 2], waiting_on=ring_left(4))


@pytest.mark.timeout(60)
def test_hung_dumps_give_a_report_and_exit_3(tmp_path: Path):
    write_dumps(tmp_path, rank3_behind())
    out = hang(str(tmp_path))
    assert out.returncode == EXIT_FAULT, out.stderr
    assert out.stderr == (
        "cclctl: error: fault found: rank 3 never entered all_reduce seq 11 of comm 0:0-3\n"
    )
    lines = out.stdout.splitlines()
    assert lines[0] == "job j1 · dumps of 4/4 ranks · 1 finding"
    assert "1. NOT ENTERED  rank 3 never entered all_reduce seq 11 of comm 0:0-3" in lines
    assert "   suspects: rank 3 (pid 1003 on host-0)" in lines
    assert "   - ranks 0-2 wait in all_reduce seq 11 of comm 0:0-3 (the longest for 30.0s)" in lines
    assert any(line.startswith("   next: rank 3's dump holds no Python stack") for line in lines)
    assert "py-spy" not in out.stdout  # post-mortem: no process to look at
    table = [line.split() for line in lines if line.startswith("0:0-3")]
    assert table == [["0:0-3", "0-3", "4", "hung", "at", "seq", "11", "10-11", "10", "3"]]


@pytest.mark.timeout(60)
def test_healthy_dumps_exit_0(tmp_path: Path):
    write_dumps(tmp_path, Job(4))
    out = hang(str(tmp_path))
    assert (out.returncode, out.stderr) == (EXIT_OK, "")
    assert "1. HEALTHY  no fault found in 4 ranks" in out.stdout


@pytest.mark.timeout(60)
def test_json_document_is_stable_and_independent_of_file_order(tmp_path: Path):
    paths = [str(p) for p in write_dumps(tmp_path, rank3_behind())]
    first = hang("--json", *paths)
    second = hang("--json", *reversed(paths))
    assert first.returncode == second.returncode == EXIT_FAULT
    assert first.stdout == second.stdout
    doc: dict[str, Any] = json.loads(first.stdout)
    assert list(doc) == [
        "schema", "version", "job", "source", "world_size", "ranks_seen", "fault", "verdicts",
        "comms", "notes", "options",
    ]  # fmt: skip
    assert (doc["schema"], doc["version"], doc["source"], doc["fault"]) == (
        "cclctl.diagnosis", 1, "dumps", True,
    )  # fmt: skip
    assert list(doc["verdicts"][0]) == [
        "kind", "summary", "suspects", "suspect_ranks", "link", "comm", "seq", "op", "evidence",
        "next_step", "where", "stacks", "origin", "shrunk_away",
    ]  # fmt: skip
    assert doc["comms"] == [
        {
            "comm": "0:0-3",
            "members": "0-3",
            "size": 4,
            "state": "hung",
            "hung_seq": 11,
            "shrunk_to": None,
            "last_started": {"min": 10, "max": 11},
            "last_completed": {"min": 10, "max": 10},
            "in_flight": 3,
        }
    ]
    assert doc["options"] == {"stale_after_s": 10.0, "skew_margin_s": 5.0, "stuck_after_s": 5.0}


@pytest.mark.timeout(60)
def test_missing_dump_and_duplicate_are_reported(tmp_path: Path):
    write_dumps(tmp_path, Job(4).enter(range(4), waiting_on=ring_left(4)), without=(2,))
    old = Job(4).stale([1], 100).snapshot(1)
    (tmp_path / "old-rank1.json").write_text(old.to_json())
    out = hang("--json", str(tmp_path), str(tmp_path / "old-rank1.json"))
    doc = json.loads(out.stdout)
    assert out.returncode == EXIT_FAULT
    assert [(v["kind"], v["suspects"]) for v in doc["verdicts"]] == [("missing", "2")]
    assert doc["notes"] == [
        "rank 1: 2 dumps (old-rank1.json, cclctl-j1-rank1.json); kept the newest, "
        "cclctl-j1-rank1.json"
    ]


def garbage_cases(tmp: Path) -> dict[str, tuple[str, str]]:
    """name -> (path, the reason the message must give)."""
    dump = Job(2).snapshot(0).to_json()
    truncated = "truncated JSON (the file ends in the middle of the document)"
    files = {
        "truncated": (dump[: len(dump) // 2].encode(), truncated),
        "schema": (b'{"schema": "other"}', "not a cclctl dump or status (schema is 'other')"),
        "binary": (bytes(range(256)), "binary data, not a JSON dump"),
        "empty": (b"", "empty file"),
    }
    cases = {}
    for name, (data, why) in files.items():
        path = tmp / f"{name}.json"
        path.write_bytes(data)
        cases[name] = (str(path), why)
    folder = tmp / "no-dumps"
    folder.mkdir()
    cases["folder"] = (str(folder), "no cclctl dumps (cclctl-<job>-rank<r>.json) in this folder")
    cases["nothing"] = (str(tmp / "absent.json"), "no such file or folder")
    return cases


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["truncated", "schema", "binary", "empty", "folder", "nothing"])
def test_unusable_input_exits_2_naming_the_file(tmp_path: Path, name: str):
    path, why = garbage_cases(tmp_path)[name]
    out = hang(path)
    assert (out.returncode, out.stdout) == (EXIT_USAGE, "")
    assert out.stderr == f"cclctl: error: {path}: {why}\n"


@pytest.mark.timeout(60)
def test_mixed_jobs_exit_2(tmp_path: Path):
    write_dumps(tmp_path, Job(2, job="a"))
    (tmp_path / "cclctl-b-rank0.json").write_text(Job(2, job="b").snapshot(0).to_json())
    out = hang(str(tmp_path))
    assert out.returncode == EXIT_USAGE
    assert out.stderr.startswith("cclctl: error: the dumps come from 2 jobs: 'a' (")
    assert hang(str(tmp_path), "--job", "a").returncode == EXIT_OK


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("x.json", "--store", "h:1"), "give dump files or --store, not both"),
        (("--store", "nohost"), "--store 'nohost' is not valid: expected HOST:PORT"),
        (("x.json", "--stuck-after", "0"), "--stuck-after must be positive, not 0.0"),
    ],
)
def test_bad_usage_exits_2(args: tuple[str, ...], message: str):
    out = hang(*args)
    assert out.returncode == EXIT_USAGE
    assert out.stderr.startswith(f"cclctl: error: {message}")


@pytest.mark.timeout(60)
def test_unreachable_store_exits_1():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once it is closed
    out = hang("--store", f"127.0.0.1:{port}")
    assert out.returncode == EXIT_ERROR
    assert out.stderr.startswith(f"cclctl: error: cannot reach the store at 127.0.0.1:{port}")


# -- live, against a real store and real processes -----------------------------------------------


@pytest.fixture
def store() -> Iterator[StoreClient]:
    with StoreServer() as srv, StoreClient(srv.host, srv.port, connect_timeout_s=5) as client:
        yield client


def publish_live(client: StoreClient, job: Job, pids: dict[int, int]) -> None:
    """Statuses of ``job`` as its ranks on this host would publish them, just now."""
    job.t0 = time.time_ns()
    job.hosts = {r: socket.gethostname() for r in range(job.n)}
    job.pids = pids
    for snap in job.snapshots("status"):
        client.set(f"cclctl/{job.job}/status/{snap.rank}", snap.to_json().encode())


@pytest.mark.timeout(60)
def test_live_sigstopped_rank(store: StoreClient, sleeper: subprocess.Popen[bytes]):
    started = psutil.Process(sleeper.pid).create_time()
    while time.time() <= started:  # the status must be newer than the process (pid reuse)
        time.sleep(0.005)
    job = Job(4).enter([0, 1, 3], waiting_on=ring_left(4)).enter([2], waiting_on={2: 1})
    me = os.getpid()
    publish_live(store, job, {0: me, 1: me, 2: sleeper.pid, 3: me})
    sleeper.send_signal(signal.SIGSTOP)
    out = hang("--store", store.address, "--json")
    assert out.returncode == EXIT_FAULT, out.stderr
    verdict = json.loads(out.stdout)["verdicts"][0]
    assert (verdict["kind"], verdict["suspects"]) == ("stopped", "2")
    assert verdict["next_step"].startswith(f"kill -CONT {sleeper.pid} on {socket.gethostname()}")


@pytest.mark.timeout(60)
def test_live_dead_rank(store: StoreClient):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    job = Job(2).enter([0], waiting_on={0: 1}).enter([1], waiting_on={1: 0})
    me = os.getpid()
    publish_live(store, job, {0: me, 1: gone.pid})
    out = hang("--store", store.address, "--job", "j1")
    assert out.returncode == EXIT_FAULT
    assert "1. DEAD  rank 1 is dead: the process is gone" in out.stdout.splitlines()
    assert out.stdout.startswith("job j1 · live statuses of 2/2 ranks · 1 finding")


@pytest.mark.timeout(60)
def test_live_healthy_job(store: StoreClient):
    me = os.getpid()
    publish_live(store, Job(3).enter(range(3), age_s=0.2), {r: me for r in range(3)})
    out = hang("--store", store.address)
    assert (out.returncode, out.stderr) == (EXIT_OK, "")


def fr_entry(seq: int, state: str = "completed") -> dict[str, Any]:
    """One entry of a PyTorch Flight Recorder dump, as NCCL writes it."""
    return {
        "record_id": seq, "pg_id": 0, "process_group": ["0", "default_pg"],
        "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
        "profiling_name": "nccl:all_reduce", "time_created_ns": 1_700_000_000_000_000_000 + seq,
        "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]],
        "output_dtypes": ["Float"], "state": state, "retired": state == "completed",
        "is_p2p": False, "frames": [],
    }  # fmt: skip


@pytest.mark.timeout(60)
def test_pytorch_flight_recorder_dumps_are_read_too(tmp_path: Path):
    """JSON dumps of a 4-rank NCCL job where rank 2 never entered seq 3."""
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}
    for rank in range(4):
        entries = [fr_entry(1), fr_entry(2)] + ([] if rank == 2 else [fr_entry(3, "started")])
        doc = {"version": "2.10", "pg_config": config, "pg_status": {}, "entries": entries}
        (tmp_path / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(doc))
    out = hang(str(tmp_path), "--stuck-after", "0.000001", "--json")
    assert out.returncode == EXIT_FAULT, out.stderr
    verdict = json.loads(out.stdout)["verdicts"][0]
    assert (verdict["kind"], verdict["suspects"], verdict["seq"]) == ("not_entered", "2", 3)
