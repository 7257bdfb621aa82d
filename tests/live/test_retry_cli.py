"""`cclctl retry` against a real store with the job's token, run as a subprocess.

Stand-in ranks are statuses in the store and, where a test needs them, threads that write
a retry's entries as the runtime does (``retry/<comm>/<epoch>/{in,up}/<rank>``). The CLI's
errors are one line with the right exit code, and nothing is written without the token.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from test_abort import HOST, JOB, TOKEN, key, ranks

from cclctl.live.rejoins import latest_epochs, rejoins_in
from cclctl.revocation import Revocation, decode
from cclctl.store.client import StoreClient, StoreServer

COMM = "0:0-3"


@pytest.fixture
def job_store() -> Iterator[tuple[StoreServer, StoreClient]]:
    with (
        StoreServer(token=TOKEN) as server,
        StoreClient.from_address(server.address, token=TOKEN, timeout_s=10) as client,
    ):
        doc = {"rank": 0, "host": HOST, "pid": os.getpid(), "world_size": 4}
        client.set(key("rdzv/world_size"), json.dumps(doc).encode())
        yield server, client


def cclctl_retry(
    address: str, *args: str, token: str | None = TOKEN
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    if token is not None:
        env["CCLCTL_TOKEN"] = token
    cmd = [sys.executable, "-m", "cclctl", "retry", "--store", address, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


def _rejoin(address: str, rank: int, epoch: int, seq: int) -> None:
    """A stand-in rank: adopts the job's record, then writes a retry's entries for it."""
    with StoreClient.from_address(address, token=TOKEN, timeout_s=30) as own:
        own.wait([key("revoke")], timeout_s=30)
        entry = {"call": "all_reduce", "pending": seq, "kept": seq - 1, "attempt": 2}
        own.set(key(f"retry/{COMM}/{epoch}/in/{rank}"), json.dumps(entry).encode())
        own.set(key(f"retry/{COMM}/{epoch}/up/{rank}"), b"1")


def test_every_rank_rejoins_and_is_named_with_its_call(
    job_store: tuple[StoreServer, StoreClient],
) -> None:
    server, client = job_store
    ranks(client, {r: os.getpid() for r in range(4)})
    client.set(key(f"retry/{COMM}/1/in/0"), b"{}")  # an earlier retry's: not this one's
    threads = [
        threading.Thread(target=_rejoin, args=(server.address, r, 2, 9), daemon=True)
        for r in range(4)
    ]
    for t in threads:
        t.start()
    out = cclctl_retry(server.address, "--job", JOB, "--reason", "drill")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"retried job {JOB} (4 ranks): retry asked by operator ")
    assert lines[0].endswith(": drill")
    assert lines[1:] == [
        "rejoined: 4 of 4 ranks",
        f"  ranks 0-3: all_reduce seq 9 of comm {COMM}, epoch 2: re-running",
    ]
    record = decode(client.get(key("revoke")))
    assert (record.kind, record.reason, record.comm) == ("retry", "drill", "")


def test_a_fatal_failure_is_not_retried(job_store: tuple[StoreServer, StoreClient]) -> None:
    server, client = job_store
    ranks(client, {r: os.getpid() for r in range(4)})
    died = Revocation(kind="died", origin=2, reason="SIGKILL", host="vm", pid=3630, seen_by=1)
    client.set(key("revoke"), died.encode())
    out = cclctl_retry(server.address, "--job", JOB, "--wait", "0")
    assert out.returncode == 3 and out.stdout == ""
    assert out.stderr == (
        f"cclctl: error: job {JOB!r} already failed: rank 2 (pid 3630 on vm) died (SIGKILL, "
        "seen by rank 1); only a link fault or an operator's retry is retried, so retry "
        "wrote nothing\n"
    )
    assert decode(client.get(key("revoke"))) == died


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
        out = cclctl_retry(server.address, *args)
        assert (out.returncode, out.stderr) == (2, f"cclctl: error: {message}\n"), args
    out = cclctl_retry(server.address, "--job", JOB, token=None)
    assert out.returncode == 2 and out.stderr.startswith(
        f"cclctl: error: retry needs the token of job {JOB!r}"
    ), out.stderr
    out = cclctl_retry(server.address, "--job", JOB, token="not-the-jobs-token")
    assert out.returncode == 2 and "retry needs the token of job" in out.stderr, out.stderr
    assert "nothing was changed" in out.stderr and len(out.stderr.splitlines()) == 1
    assert client.try_get(key("revoke")) is None
    out = cclctl_retry("no-port-here", "--job", JOB)
    assert out.returncode == 2 and out.stderr == (
        "cclctl: error: --store 'no-port-here' is not valid: expected HOST:PORT with a port "
        "from 1 to 65535\n"
    ), out.stderr
    out = cclctl_retry("127.0.0.1:1", "--job", JOB)
    assert out.returncode == 1 and "cannot reach the store" in out.stderr
    assert len(out.stderr.splitlines()) == 1


def test_rejoins_are_read_from_the_newest_epoch_past_the_one_before() -> None:
    head = f"cclctl/{JOB}/retry/{COMM}"
    entry = json.dumps({"call": "all_reduce", "pending": 4}).encode()
    listing = {
        f"{head}/1/in/0": entry,
        f"{head}/2/in/0": entry,
        f"{head}/2/up/0": b"1",
        f"{head}/2/in/1": b"not json",
        f"cclctl/{JOB}/retry/bad/x/in/0": entry,
    }
    assert latest_epochs(listing, JOB) == {COMM: 2}
    found = rejoins_in(listing, JOB, {COMM: 1}, inclusive=False)
    assert sorted(found) == [0, 1]
    assert (found[0].epoch, found[0].seq, found[0].up) == (2, 4, True)
    assert (found[1].op, found[1].seq, found[1].up) == ("", 0, False)
    assert rejoins_in(listing, JOB, {COMM: 2}, inclusive=False) == {}
    assert sorted(rejoins_in(listing, JOB, {COMM: 2}, inclusive=True)) == [0, 1]


def test_a_sub_communicators_entries_are_not_the_worlds_rejoins() -> None:
    """A new_group's retry keys its entries by its own ranks (group rank 0 of ``1:2-3`` is
    job rank 2) and follows no operator's record: `cclctl retry` counts the world's only."""
    entry = json.dumps({"call": "all_reduce", "pending": 7}).encode()
    listing = {
        f"cclctl/{JOB}/retry/{COMM}/1/in/1": entry,
        f"cclctl/{JOB}/retry/1:2-3/1/in/0": entry,
        f"cclctl/{JOB}/retry/1:2-3/1/up/0": b"1",
    }
    found = rejoins_in(listing, JOB, {}, inclusive=False, world_size=4)
    assert sorted(found) == [1]
    assert (found[1].comm, found[1].seq, found[1].up) == (COMM, 7, False)


def test_help_teaches_with_an_example() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cclctl", "retry", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"COLUMNS": "200"},
    )
    assert out.returncode == 0
    for words in ("cclctl retry --store node0:29500", "CCLCTL_TOKEN", "--wait", "Exit codes"):
        assert words in out.stdout
