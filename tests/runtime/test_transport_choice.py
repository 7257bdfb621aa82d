"""Which transport a job gets: every rank must reach the same choice from the same facts."""

from __future__ import annotations

import json
import sys
import threading

import pytest
from shm_thread_ranks import CFG, MemoryExchange, make_transports

from cclctl.launch.launcher import launch
from cclctl.runtime.transport.base import Transport
from cclctl.runtime.transport.hybrid import HybridTransport, build_transport
from cclctl.runtime.transport.shm import segment as shm_segment
from cclctl.runtime.transport.shm.transport import ShmTransport
from cclctl.runtime.transport.tcp.links import Links
from cclctl.runtime.transport.tcp.transport import TcpTransport
from scripts import script

WORKER = script("shm_worker.py")
pytestmark = pytest.mark.timeout(60)


def kinds(transports: list[Transport]) -> list[str]:
    try:
        return [type(t).__name__ for t in transports]
    finally:
        for t in transports:
            t.close()


@pytest.mark.parametrize(
    ("hosts", "want"),
    [
        (["a", "a", "a"], "ShmTransport"),
        (["a", "b", "c"], "TcpTransport"),  # nobody shares a host
        (["a", "a", "b"], "HybridTransport"),  # rank 2 alone on its host: hybrid too
    ],
)
def test_host_keys_decide(hosts: list[str], want: str) -> None:
    assert kinds(make_transports(len(hosts), hosts)) == [want] * len(hosts)


def test_one_rank_asking_for_tcp_gives_every_rank_tcp() -> None:
    n = 3
    exchange = MemoryExchange(n)
    out: list[Transport | None] = [None] * n

    def open_one(r: int) -> None:
        links = Links(r, n, CFG.job, "127.0.0.1", CFG.connect_timeout_s, token="test-token")
        choice = "tcp" if r == 1 else "auto"
        out[r] = build_transport(
            r, n, CFG.job, exchange.for_rank(r), links, choice=choice, host="h"
        )

    threads = [threading.Thread(target=open_one, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert kinds([t for t in out if t is not None]) == ["TcpTransport"] * n


def test_hybrid_routes_local_peers_through_shared_memory() -> None:
    transports = make_transports(4, ["a", "b", "a", "b"])
    try:
        hybrid = transports[0]
        assert isinstance(hybrid, HybridTransport)
        assert hybrid.shm is not None and isinstance(hybrid.tcp, TcpTransport)
        assert [hybrid.shm.is_local(p) for p in range(4)] == [True, False, True, False]
        assert hybrid.hierarchy is not None and hybrid.hierarchy.leaders == [0, 1]
    finally:
        kinds(transports)


def test_the_host_key_tells_kernels_shm_mounts_and_pid_namespaces_apart() -> None:
    key = shm_segment.host_key()
    boot, dev, pidns = key.rsplit(":", 2)
    assert boot and dev.lstrip("-").isdigit() and pidns == str(shm_segment.pid_namespace())
    assert key == shm_segment.host_key()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, "shm"),
        ({"CCLCTL_TRANSPORT": "tcp"}, "tcp"),
        ({"FAKE_HOSTS": "2", "COUNT": "100000"}, "hybrid"),  # hierarchical, ring across
    ],
)
def test_a_launched_job_uses_shared_memory_unless_told_tcp(env: dict[str, str], want: str) -> None:
    lines: list[str] = []
    result = launch(
        [sys.executable, WORKER],
        4,
        env={**env, "ITERS": "3"},
        output=lambda rank, stream, line: lines.append(line),
        timeout_s=60,
    )
    assert result.returncode == 0, lines
    joined = [json.loads(line) for line in lines if line.startswith('{"rank"')]
    assert sorted(j["transport"] for j in joined if "transport" in j) == [want] * 4
    assert sum(1 for j in joined if j.get("done")) == 4


def test_shm_transport_is_a_transport() -> None:
    transports = make_transports(2)
    assert all(isinstance(t, ShmTransport) and t.name == "shm" for t in transports)
    kinds(transports)
