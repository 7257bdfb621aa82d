"""The job's store with its token: strangers read statuses, nothing more.

Each test is an attack that worked with nothing but the store's address: aborting the
rendezvous through ``rdzv/error``, forging or hiding a rank's status, making every rank dump
with the attacker's words. A live job's ranks prove the token; the attacker cannot, and the
job goes on untouched while ``top`` and ``diagnose hang`` still read it without a token.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from live_job import live_job
from store_attacks import closed_by_peer, connect

from cclctl import auth
from cclctl.errors import StoreError
from cclctl.live import snapshot
from cclctl.store import access
from cclctl.store.client import StoreClient, StoreServer
from cclctl.store.protocol import REPLY_HEADER, Op, Status, pack_request

TOKEN = "auth-test-token"
JOB = "attacked"

#: A rank: a few collectives, then it waits for the test; rank 0 then reports, through
#: its own token-proving client, what the attacker left in the store.
WORKER = """
import json, os, sys, time
import numpy as np
import cclctl
from cclctl.live import snapshot
from cclctl.store.client import StoreClient

comm = cclctl.init()
try:
    for _ in range(3):
        comm.all_reduce(np.ones(1024, dtype=np.float32))
    print(json.dumps({"rank": comm.rank, "store": os.environ["CCLCTL_STORE"]}), flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        time.sleep(0.05)
    comm.all_reduce(np.ones(1024, dtype=np.float32))  # the job goes on
    if comm.rank == 0:
        job = "cclctl/" + os.environ["CCLCTL_JOB"] + "/"
        with StoreClient.from_address(
            os.environ["CCLCTL_STORE"], token=os.environ["CCLCTL_TOKEN"]
        ) as own:
            left = {k: own.try_get(job + k) for k in ("rdzv/error", "signal/dump/count")}
            status1 = {"rank": snapshot.fetch(own, os.environ["CCLCTL_JOB"]).statuses[1].rank}
        print("LEFT " + json.dumps({k: v and v.decode() for k, v in left.items()}
                                   | {"status1_rank": status1["rank"]}), flush=True)
finally:
    comm.close()
"""


def _refused(verb: str, call: Any) -> None:
    with pytest.raises(StoreError, match=rf"refused: {verb} of .*: no token"):
        call()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CCLCTL_TOKEN"}
    return subprocess.run(
        [sys.executable, "-m", "cclctl", *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.timeout(120)
def test_a_live_job_is_untouched_by_a_client_without_its_token(tmp_path: Path) -> None:
    release = tmp_path / "release"
    env = {"CCLCTL_JOB": JOB, "CCLCTL_STATUS_INTERVAL": "0.2"}
    with live_job([sys.executable, "-c", WORKER, str(release)], 2, env, release) as job:
        store = job.store
        with StoreClient.from_address(store, timeout_s=10) as stranger:
            prefix = f"cclctl/{JOB}/"
            _refused("set", lambda: stranger.set(prefix + "rdzv/error", b"aborted by me"))
            _refused(
                "compare-and-set", lambda: stranger.compare_set(prefix + "rdzv/error", None, b"x")
            )
            _refused("set", lambda: stranger.set(prefix + "status/1", b'{"rank": 1}'))
            _refused("delete", lambda: stranger.delete(prefix + "status/1"))
            _refused("add", lambda: stranger.add(prefix + "signal/dump/count", 1))
            _refused("set", lambda: stranger.set(prefix + "signal/dump/why", b"my words"))
            _refused("get", lambda: stranger.try_get(prefix + "rdzv/rank/0"))
            _refused("set", lambda: stranger.set_many({prefix + "head/h": b"{}"}))
            _refused("set", lambda: stranger.set_many({prefix + "status/1": b"{}"}))
            _refused("wait", lambda: stranger.wait([prefix + "rdzv/rank/0"], timeout_s=1))
            deadline = time.monotonic() + 30
            while True:  # the statuses and the world size, nothing else
                seen = stranger.list(prefix)
                assert all(access.PUBLIC_KEYS.fullmatch(key.encode()) for key in seen)
                if set(snapshot.parse(JOB, store, seen).statuses) == {0, 1}:
                    break
                assert time.monotonic() < deadline, sorted(seen)
                time.sleep(0.05)
            assert f"{prefix}rdzv/world_size" in seen
            # a key it may list it may read alone (a large job's reader reads a few hosts)
            assert stranger.try_get(prefix + "rdzv/world_size") == seen[f"{prefix}rdzv/world_size"]
        top = _cli("top", "--store", store, "--job", JOB, "--json")
        assert top.returncode == 0, top.stderr
        doc = json.loads(top.stdout)
        assert (doc["ranks_seen"], doc["missing"]) == (2, [])
        diagnosis = _cli("diagnose", "hang", "--store", store, "--job", JOB)
        assert diagnosis.returncode == 0, diagnosis.stdout + diagnosis.stderr
    left = next(line for line in job.lines if "LEFT " in line).split("LEFT ", 1)[1]
    assert json.loads(left) == {"rdzv/error": None, "signal/dump/count": None, "status1_rank": 1}


def test_an_agents_document_and_its_head_in_one_request_are_an_agents_write() -> None:
    job = b"cclctl/j/"
    assert access.is_agents(Op.SET_MANY, [job + b"host/h1", b"{}", job + b"head/h1", b"{}"])
    assert not access.is_agents(Op.SET_MANY, [job + b"host/h1", b"{}", job + b"status/1", b""])
    assert not access.is_agents(Op.SET_MANY, [])
    assert access.refusal(Op.TRY_GET, [job + b"head/h1"]) is None  # what LIST shows anyone
    assert access.refusal(Op.TRY_GET, [job + b"rdzv/world"]) is not None
    assert access.refusal(Op.SET_MANY, [job + b"head/h1", b"{}"]) is not None


def test_a_wrong_proof_closes_the_connection() -> None:
    with StoreServer(token=TOKEN) as server:
        raw = connect(server.port)
        raw.sendall(pack_request(Op.HELLO, [auth.nonce()]))
        status, _ = REPLY_HEADER.unpack(raw.recv(REPLY_HEADER.size))
        assert status == Status.OK
        raw.sendall(pack_request(Op.AUTH, [b"\0" * auth.PROOF_BYTES]))
        assert closed_by_peer(raw)
        assert server.rejected["bad_proof"] == 1
        raw.close()


def test_a_client_with_a_token_finds_out_a_store_without_it() -> None:
    """A fake store (another job's, or one with no token) cannot prove the job's token."""
    with StoreServer(token="another-jobs-token") as other, StoreServer() as open_store:
        with pytest.raises(StoreError, match="cannot prove it holds the job's token"):
            StoreClient("127.0.0.1", other.port, token=TOKEN, connect_timeout_s=5)
        with pytest.raises(StoreError, match="has no token"):
            StoreClient("127.0.0.1", open_store.port, token=TOKEN, connect_timeout_s=5)
        assert other.rejected["bad_proof"] == 0  # the client gave up before answering


def test_the_proofs_cannot_be_replayed_or_reflected() -> None:
    """A proof answers one pair of nonces in one role: not another connection's, not the
    other side's."""
    client_nonce, server_nonce = auth.nonce(), auth.nonce()
    proof = access.client_proof(TOKEN, server_nonce, client_nonce)
    assert proof != access.client_proof(TOKEN, auth.nonce(), client_nonce)
    assert proof != access.server_proof(TOKEN, client_nonce, server_nonce)
    assert proof != access.server_proof(TOKEN, server_nonce, client_nonce)


def test_a_client_with_the_token_may_do_everything() -> None:
    with StoreServer(token=TOKEN) as server:
        with StoreClient("127.0.0.1", server.port, token=TOKEN, timeout_s=10) as rank:
            rank.set("a", b"1")
            assert rank.add("n", 2) == 2 and rank.compare_set("a", b"1", b"2") == b"2"
            assert rank.list("") == {"a": b"2", "n": b"2"} and rank.delete("a")
        assert server.refused == 0


def test_a_store_bound_where_asked() -> None:
    """Rank 0 in env mode never listens on every interface unless CCLCTL_STORE_ADDR says so:
    a MASTER_ADDR that is not this host's is exit 2, one line, no traceback."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCLCTL_", "MASTER_"))}
    env |= {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "192.0.2.1", "MASTER_PORT": str(port)}
    bench = [sys.executable, "-m", "cclctl", "bench", "-b", "8", "-e", "8", "-n", "1", "-w", "0"]
    refused = subprocess.run(bench, capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 2, refused.stderr
    assert "CCLCTL_STORE_ADDR" in refused.stderr and "Traceback" not in refused.stderr
    asked = subprocess.run(
        bench,
        capture_output=True,
        text=True,
        timeout=60,
        env=env | {"CCLCTL_STORE_ADDR": "127.0.0.1", "CCLCTL_STORE_LINGER": "1"},
    )
    assert asked.returncode == 0, asked.stderr
