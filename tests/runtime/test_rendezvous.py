"""Rendezvous over a real store: thread ranks for the rules, process ranks for ``join``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from typing import Any

import pytest
from ports import free_port

from cclctl.config import RuntimeConfig
from cclctl.errors import ConfigError, RendezvousError
from cclctl.runtime.job.rendezvous import Rendezvous, _bind_host, join_store
from cclctl.store.client import StoreClient, StoreServer
from cclctl.store.scope import ScopedStore

PID = os.getpid()


def cfg(job: str = "job", host: str = "host-a", connect_timeout_s: float = 10.0) -> RuntimeConfig:
    return RuntimeConfig(job=job, hostname=host, timeout_s=5.0, connect_timeout_s=connect_timeout_s)


def join_in_thread(
    server: StoreServer, rank: int, world_size: int, config: RuntimeConfig
) -> tuple[threading.Thread, dict[str, Any]]:
    """Start ``join_store`` on a thread; the dict gets ``rdzv`` or ``error`` when it ends."""
    out: dict[str, Any] = {}

    def body() -> None:
        client = StoreClient("127.0.0.1", server.port, connect_timeout_s=5)
        try:
            out["rdzv"] = join_store(client, rank, world_size, config)
        except BaseException as exc:
            out["error"] = exc
            client.close()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, out


def join_all(server: StoreServer, ranks: list[int], world_size: int, config: RuntimeConfig) -> list:
    started = [join_in_thread(server, r, world_size, config) for r in ranks]
    for thread, _ in started:
        thread.join(20)
    assert not any(thread.is_alive() for thread, _ in started)
    return [out.get("rdzv", out.get("error")) for _, out in started]


def close_all(items: list) -> None:
    for item in items:
        if isinstance(item, Rendezvous):
            item.close()


@pytest.mark.timeout(20)
def test_ranks_join_and_exchange_values_by_rank(server: StoreServer) -> None:
    joined = join_all(server, [0, 1, 2, 3], 4, cfg())
    try:
        assert [r.rank for r in joined] == [0, 1, 2, 3]
        assert all(r.hosts == ["host-a"] * 4 for r in joined)
        results: list[Any] = [None] * 4

        def body(r: Rendezvous) -> None:
            first = r.exchange("addr", f"a{r.rank}".encode(), 5)
            second = r.exchange("addr", f"b{r.rank}".encode(), 5)  # a new round, no stale values
            results[r.rank] = (first, second)

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in joined]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        expected = ([b"a0", b"a1", b"a2", b"a3"], [b"b0", b"b1", b"b2", b"b3"])
        assert results == [expected] * 4
    finally:
        close_all(joined)


@pytest.mark.timeout(20)
def test_a_rank_claimed_twice_names_both_processes(server: StoreServer) -> None:
    # The first claimant's own rendezvous timeout lies far beyond this test's: it can only
    # end here by learning of the clash.
    first, first_out = join_in_thread(server, 1, 2, cfg(host="host-a", connect_timeout_s=600))
    client = StoreClient("127.0.0.1", server.port)
    client.get("cclctl/job/rdzv/rank/1", timeout_s=5)  # host-a's claim is in; it waits for rank 0
    with pytest.raises(RendezvousError) as info:
        join_store(client, 1, 2, cfg(host="host-b"))
    client.close()
    message = f"rank 1 is claimed twice: by host-a pid {PID} and host-b pid {PID}"
    assert str(info.value) == message
    first.join(10)
    assert not first.is_alive(), "the first claimant still waits for its own timeout"
    assert str(first_out["error"]) == f"rendezvous abandoned: {message}"


@pytest.mark.timeout(20)
def test_world_size_disagreement_names_both_values_and_who_set_the_first(
    server: StoreServer,
) -> None:
    first, first_out = join_in_thread(server, 0, 2, cfg(host="host-a"))
    client = StoreClient("127.0.0.1", server.port)
    client.get("cclctl/job/rdzv/rank/0", timeout_s=5)  # host-a set the world size and claimed
    with pytest.raises(RendezvousError) as info:
        join_store(client, 1, 3, cfg(host="host-b"))
    client.close()
    assert str(info.value) == (
        f"world size disagreement: rank 1 (host-b pid {PID}) was started with world size 3, "
        f"but rank 0 (host-a pid {PID}) set it to 2 first"
    )
    first.join(5)
    assert "world size disagreement" in str(first_out["error"])


@pytest.mark.timeout(20)
def test_missing_ranks_are_named_folded(server: StoreServer) -> None:
    outcomes = join_all(server, [0, 1, 3, 4], 8, cfg(job="j", connect_timeout_s=0.6))
    expected = (
        "rendezvous timed out after 0.6s: ranks 2,5-7 of 8 never arrived "
        f"(job 'j', store {server.address})"
    )
    assert [str(e) for e in outcomes] == [expected] * 4
    assert outcomes[0].fields["missing"] == "2,5-7"


@pytest.mark.timeout(20)
def test_exchange_timeout_names_the_rank_that_never_called(server: StoreServer) -> None:
    joined = join_all(server, [0, 1, 2], 3, cfg(job="j"))
    errors: list[BaseException] = []

    def body(r: Rendezvous) -> None:
        try:
            r.exchange("addr", b"x", 0.5)
        except RendezvousError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in joined[:2]]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        expected = (
            "exchange 'addr' timed out after 0.5s: rank 2 of 3 never arrived "
            f"(job 'j', store {server.address})"
        )
        assert [str(e) for e in errors] == [expected] * 2
    finally:
        close_all(joined)


@pytest.mark.timeout(20)
def test_stale_keys_of_another_job_are_ignored(server: StoreServer) -> None:
    with StoreClient("127.0.0.1", server.port) as old:
        stale = ScopedStore.for_job(old, "old")
        stale.set("rdzv/world_size", json.dumps({"world_size": 16, "rank": 0}).encode())
        stale.set("rdzv/rank/0", b'{"host": "gone", "pid": 1}')
        stale.set("x/addr/0/1", b"stale")
    joined = join_all(server, [0, 1], 2, cfg(job="new"))
    try:
        assert [r.world_size for r in joined] == [2, 2]
        assert [r.job_store.prefix for r in joined] == ["cclctl/new/"] * 2
    finally:
        close_all(joined)


def test_rank_out_of_range_is_refused(server: StoreServer) -> None:
    with (
        StoreClient("127.0.0.1", server.port) as client,
        pytest.raises(RendezvousError, match="rank 4 is out of range for world size 4"),
    ):
        join_store(client, 4, 4, cfg())


def test_bind_host_never_falls_back_to_every_interface_unless_asked() -> None:
    assert _bind_host("127.0.0.1") == "127.0.0.1"
    assert _bind_host("localhost") == "localhost"
    for foreign in ("192.0.2.1", "no-such-host.invalid"):  # TEST-NET-1: never this host's
        with pytest.raises(ConfigError, match="CCLCTL_STORE_ADDR") as caught:
            _bind_host(foreign)
        assert caught.value.exit_code == 2 and foreign in caught.value.message
    assert _bind_host("192.0.2.1", "0.0.0.0") == "0.0.0.0"  # asked for: CCLCTL_STORE_ADDR


RANK_SCRIPT = """
import json, sys
from cclctl.config import rendezvous_from_env, runtime_from_env
from cclctl.errors import CclError
from cclctl.runtime.job.rendezvous import join
try:
    rdzv = join(rendezvous_from_env(), runtime_from_env())
    values = rdzv.exchange("who", str(rdzv.rank).encode(), 10)
    print(json.dumps({"rank": rdzv.rank, "values": [v.decode() for v in values],
                      "hosting": rdzv.server is not None}), flush=True)
    rdzv.close()
except CclError as exc:
    print(f"ERROR {exc}", flush=True)
    sys.exit(1)
"""


def run_ranks(ranks: list[int], world_size: int, timeout_s: float = 30) -> list[tuple[int, str]]:
    """Start one process per entry of ``ranks`` (RANK may repeat); (exit code, stdout) each."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCLCTL_", "TORCHELASTIC"))}
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(world_size),
        CCLCTL_JOB="procs",
        CCLCTL_CONNECT_TIMEOUT="10",
        CCLCTL_TIMEOUT="10",
        CCLCTL_STORE_LINGER="1",  # rank 0's store process: gone soon after the test
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT],
            env=dict(env, RANK=str(rank)),
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in ranks
    ]
    try:
        return [(p.wait(timeout_s), p.stdout.read().strip()) for p in procs if p.stdout]
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.timeout(60)
def test_processes_join_with_rank_zero_hosting_the_store() -> None:
    results = run_ranks([2, 0, 1], 3)  # rank 0 is not first to start: others retry
    assert [code for code, _ in results] == [0, 0, 0]
    reports = sorted((json.loads(out) for _, out in results), key=lambda r: r["rank"])
    assert [r["values"] for r in reports] == [["0", "1", "2"]] * 3
    assert [r["hosting"] for r in reports] == [True, False, False]


@pytest.mark.timeout(60)
def test_processes_claiming_the_same_rank_fail_naming_both_pids() -> None:
    # Rank 2 never starts, so nobody can finish before the duplicate claim lands.
    results = run_ranks([0, 1, 1], 3)
    assert [code for code, _ in results] == [1, 1, 1]  # the whole job fails, and fast
    host = socket.gethostname()
    for _, out in results:
        assert "rank 1 is claimed twice: by " in out
        assert out.count(f"{host} pid ") == 2
