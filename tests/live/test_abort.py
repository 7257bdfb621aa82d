"""`cclctl abort` against a real store with the job's token, run as a subprocess.

Stand-in ranks are threads with store clients of their own, as ranks have: each waits on the
job's ``revoke`` key, reads the record and writes its ``revoke_ack/<rank>``. A "frozen"
rank never acknowledges and its status is old; a stopped rank is a real process under
SIGSTOP; a dead one is a process that has exited. Their statuses name this host, so the
process table speaks for them as it does for real ranks.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cclctl import auth
from cclctl.config import job_dir
from cclctl.live.acks import parse_ack
from cclctl.records import CommInfo, RankSnapshot
from cclctl.revocation import OPERATOR, Revocation, ack_key, decode
from cclctl.store.client import StoreClient, StoreServer

TOKEN = "abort-test-token"
JOB = "train7"
HOST = socket.gethostname()


def status(rank: int, pid: int, *, world: int = 4, age_s: float = 0.1, host: str = HOST) -> bytes:
    """A rank's status as its publisher writes it, ``age_s`` seconds old, on ``host``."""
    snap = RankSnapshot(
        kind="status",
        job=JOB,
        rank=rank,
        world_size=world,
        host=host,
        pid=pid,
        time_ns=time.time_ns() - int(age_s * 1e9),
        comms={f"0:0-{world - 1}": CommInfo(list(range(world)), 5, 4)},
        counters={"collectives": 4, "errors": 0, "retries": 0, "hangs": 0},
    )
    return snap.to_json().encode()


def key(name: str) -> str:
    return f"cclctl/{JOB}/{name}"


class StandIn(threading.Thread):
    """A rank: waits on the revoke key with its own client, adopts the record, acks it."""

    def __init__(self, address: str, rank: int, in_call: str = "") -> None:
        super().__init__(daemon=True)
        self.address, self.rank, self.in_call = address, rank, in_call
        self.record: Revocation | None = None

    def run(self) -> None:
        with StoreClient.from_address(self.address, token=TOKEN, timeout_s=30) as own:
            own.wait([key("revoke")], timeout_s=30)
            self.record = decode(own.get(key("revoke")))
            ack = {
                "rank": self.rank,
                "pid": os.getpid(),
                "host": HOST,
                "in_call": self.in_call,
                "time_ns": time.time_ns(),
            }
            own.set(key(ack_key(self.rank)), json.dumps(ack).encode())


@pytest.fixture
def job_store() -> Iterator[tuple[StoreServer, StoreClient]]:
    """The job's store (with its token) and a rank's client; the world of 4 rendezvoused."""
    with (
        StoreServer(token=TOKEN) as server,
        StoreClient.from_address(server.address, token=TOKEN, timeout_s=10) as client,
    ):
        doc = {"rank": 0, "host": HOST, "pid": os.getpid(), "world_size": 4}
        client.set(key("rdzv/world_size"), json.dumps(doc).encode())
        yield server, client


def ranks(client: StoreClient, pids: dict[int, int], ages: dict[int, float] | None = None) -> None:
    for rank, pid in pids.items():
        client.set(key(f"status/{rank}"), status(rank, pid, age_s=(ages or {}).get(rank, 0.1)))


def start(address: str, calls: dict[int, str]) -> list[StandIn]:
    stand_ins = [StandIn(address, rank, call) for rank, call in calls.items()]
    for s in stand_ins:
        s.start()
    return stand_ins


def cclctl_abort(
    address: str, *args: str, token: str | None = TOKEN, tmpdir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    if token is not None:
        env["CCLCTL_TOKEN"] = token
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    cmd = [sys.executable, "-m", "cclctl", "abort", "--store", address, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


def joined(stand_ins: list[StandIn]) -> list[Revocation]:
    for s in stand_ins:
        s.join(30)
    assert all(s.record is not None for s in stand_ins)
    return [s.record for s in stand_ins if s.record is not None]


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process of this host to stand for a rank's (stopped or dead, as a test makes it)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc
    finally:
        proc.kill()  # SIGKILL ends a stopped process too
        proc.wait(10)


def test_every_rank_acknowledges_in_or_between_calls(
    job_store: tuple[StoreServer, StoreClient],
) -> None:
    server, client = job_store
    ranks(client, {r: os.getpid() for r in range(4)})
    stand_ins = start(server.address, {0: "all_reduce seq 5", 1: "all_reduce seq 5", 2: "", 3: ""})
    out = cclctl_abort(server.address, "--job", JOB, "--reason", "bad data shard")
    assert out.returncode == 0, out.stdout + out.stderr
    records = joined(stand_ins)
    user = out.stdout.split("aborted by operator ", 1)[1].split(":", 1)[0]
    assert user.endswith(f"@{HOST}")
    assert {r.describe() for r in records} == {f"aborted by operator {user}: bad data shard"}
    assert {(r.kind, r.origin, r.seen_by, r.via, r.comm) for r in records} == {
        ("aborted", OPERATOR, OPERATOR, "operator", "")
    }
    assert out.stdout.splitlines() == [
        f"aborted job {JOB} (4 ranks): aborted by operator {user}: bad data shard",
        "acknowledged: 4 of 4 ranks",
        "  ranks 0-1: in all_reduce seq 5",
        "  ranks 2-3: between calls",
    ]


def test_a_frozen_rank_is_named_and_the_exit_is_3(
    job_store: tuple[StoreServer, StoreClient],
) -> None:
    """Rank 3, on another host, last published a minute ago and never acks."""
    server, client = job_store
    ranks(client, {r: os.getpid() for r in range(3)})
    client.set(key("status/3"), status(3, 4242, age_s=60.0, host="node-9"))
    stand_ins = start(server.address, {0: "all_reduce seq 5", 1: "", 2: ""})
    out = cclctl_abort(server.address, "--job", JOB, "--wait", "1")
    assert out.returncode == 3, out.stdout + out.stderr
    joined(stand_ins)
    lines = [re.sub(r"6\d\.\ds ago", "60s ago", line) for line in out.stdout.splitlines()]
    assert lines[1:] == [
        "acknowledged: 3 of 4 ranks",
        "  rank 0: in all_reduce seq 5",
        "  ranks 1-2: between calls",
        "not acknowledged within 1s: 1",
        "  rank 3 (pid 4242 on node-9): stale heartbeat (last status 60s ago)",
    ]
    assert out.stderr.strip().splitlines() == [
        f"cclctl: error: rank 3 of job {JOB!r} did not acknowledge the abort within 1s"
    ]


def test_stopped_dead_and_missing_ranks(
    job_store: tuple[StoreServer, StoreClient], sleeper: subprocess.Popen[bytes]
) -> None:
    """Rank 1's process is SIGSTOPped, rank 2's has exited, rank 3 never published: a dead
    rank is not live, but the stopped and the missing one leave the abort incomplete."""
    server, client = job_store
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    ranks(client, {0: os.getpid(), 1: sleeper.pid, 2: gone.pid})
    os.kill(sleeper.pid, signal.SIGSTOP)
    stand_ins = start(server.address, {0: ""})
    out = cclctl_abort(server.address, "--job", JOB, "--wait", "0.5", "--json")
    assert out.returncode == 3, out.stdout + out.stderr
    joined(stand_ins)
    doc = json.loads(out.stdout)
    assert (doc["schema"], doc["version"], doc["job"], doc["world_size"]) == (
        "cclctl.abort",
        1,
        JOB,
        4,
    )
    assert doc["written"] is True and doc["complete"] is False
    assert doc["record"]["kind"] == "aborted" and doc["describe"].startswith("aborted by operator")
    assert [a["rank"] for a in doc["acknowledged"]] == [0]
    assert [(s["rank"], s["state"], s["live"], s["pid"]) for s in doc["silent"]] == [
        (1, "stopped", True, sleeper.pid),
        (2, "dead", False, gone.pid),
        (3, "missing", True, 0),
    ]
    assert doc["silent"][0]["reason"] == "stopped (SIGSTOP)"
    assert "ranks 1,3 of job" in out.stderr


def test_a_dead_rank_leaves_the_abort_complete(job_store: tuple[StoreServer, StoreClient]) -> None:
    server, client = job_store
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    ranks(client, {0: os.getpid(), 1: os.getpid(), 2: os.getpid(), 3: gone.pid})
    stand_ins = start(server.address, {0: "", 1: "", 2: ""})
    out = cclctl_abort(server.address, "--wait", "0.5")  # the only job: no --job needed
    assert out.returncode == 0, out.stdout + out.stderr
    joined(stand_ins)
    assert out.stdout.splitlines()[-2:] == [
        "not acknowledged within 0.5s: 1",
        f"  rank 3 (pid {gone.pid} on {HOST}): dead: the process is gone",
    ]


def test_without_the_token_nothing_changes(
    job_store: tuple[StoreServer, StoreClient], tmp_path: Path
) -> None:
    server, client = job_store
    ranks(client, {r: os.getpid() for r in range(4)})
    out = cclctl_abort(server.address, "--job", JOB, token=None, tmpdir=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    folder = job_dir(JOB, {"TMPDIR": str(tmp_path)})
    assert out.stderr.splitlines() == [
        f"cclctl: error: abort needs the token of job {JOB!r} to write to its store: set "
        f"CCLCTL_TOKEN, or run it on the host whose {folder}/token holds it (none there); "
        "nothing was changed"
    ]
    assert out.stdout == ""
    wrong = cclctl_abort(server.address, "--job", JOB, token="another-jobs-token")
    assert wrong.returncode == 2, wrong.stdout + wrong.stderr
    assert len(wrong.stderr.splitlines()) == 1 and "Traceback" not in wrong.stderr
    assert wrong.stderr.startswith(
        f"cclctl: error: abort needs the token of job {JOB!r} and the store"
    )
    unnamed = cclctl_abort(server.address, token="another-jobs-token")  # no --job either
    assert unnamed.returncode == 2, unnamed.stdout + unnamed.stderr
    assert unnamed.stderr.startswith("cclctl: error: abort needs the job's token and the store")
    assert client.try_get(key("revoke")) is None
    assert client.list(key("revoke")) == {}


def test_the_token_file_on_this_host_is_enough(
    job_store: tuple[StoreServer, StoreClient], tmp_path: Path
) -> None:
    server, client = job_store
    auth.write_token_file(job_dir(JOB, {"TMPDIR": str(tmp_path)}), TOKEN)
    ranks(client, {r: os.getpid() for r in range(4)})
    stand_ins = start(server.address, {r: "" for r in range(4)})
    out = cclctl_abort(server.address, "--job", JOB, token=None, tmpdir=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(joined(stand_ins)) == 4


def test_a_job_that_already_failed_keeps_its_record(
    job_store: tuple[StoreServer, StoreClient],
) -> None:
    server, client = job_store
    ranks(client, {r: os.getpid() for r in range(4)})
    died = Revocation(
        kind="died", origin=2, reason="SIGKILL", host="vm", pid=3630, seen_by=1, via="pidfd"
    )
    client.set(key("revoke"), died.encode())
    for rank in (0, 1, 3):
        ack = {"rank": rank, "pid": os.getpid(), "host": HOST, "in_call": "", "time_ns": 1}
        client.set(key(ack_key(rank)), json.dumps(ack).encode())
    out = cclctl_abort(server.address, "--job", JOB, "--wait", "0.3")
    assert decode(client.get(key("revoke"))) == died  # the first failure stays the job's
    assert out.stdout.splitlines()[:3] == [
        f"job {JOB} already failed: rank 2 (pid 3630 on vm) died (SIGKILL, seen by rank 1); "
        "abort wrote nothing",
        "acknowledged: 3 of 4 ranks",
        "  ranks 0-1,3: between calls",
    ]
    assert out.returncode == 3  # rank 2's status is fresh and its "process" (this one) runs


def test_bad_input_is_one_line_and_writes_nothing(
    job_store: tuple[StoreServer, StoreClient],
) -> None:
    server, client = job_store
    ranks(client, {r: os.getpid() for r in range(4)})
    cases = {
        ("--job", "trian7"): f"job 'trian7' has published no status to {server.address} yet",
        ("--job", JOB, "--wait", "-1"): "--wait must be zero or more, not -1.0",
        ("--job", JOB, "--stale", "0"): "--stale must be positive, not 0.0",
    }
    for args, message in cases.items():
        out = cclctl_abort(server.address, *args)
        assert (out.returncode, out.stderr) == (2, f"cclctl: error: {message}\n"), args
    assert client.list("cclctl/trian7/") == {} and client.try_get(key("revoke")) is None
    out = cclctl_abort("127.0.0.1:1", "--job", JOB)
    assert out.returncode == 1 and "cannot reach the store" in out.stderr
    assert len(out.stderr.splitlines()) == 1


def test_an_ack_is_read_defensively() -> None:
    assert parse_ack(b"not json", 3) == parse_ack(b"[1]", 3) == parse_ack(b"{}", 3)
    ack = parse_ack(json.dumps({"pid": "x", "host": 7, "in_call": "all_gather seq 2"}).encode(), 1)
    assert (ack.rank, ack.pid, ack.host, ack.words()) == (1, 0, "", "in all_gather seq 2")


def test_help_teaches_with_an_example() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cclctl", "abort", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"COLUMNS": "200"},
    )
    assert out.returncode == 0
    for words in ("cclctl abort --store node0:29500", "CCLCTL_TOKEN", "--wait", "Exit codes"):
        assert words in out.stdout
