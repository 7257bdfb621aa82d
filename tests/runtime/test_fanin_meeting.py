"""The transport's meeting after a fan-in rendezvous, over a real store, thread ranks.

The world document comes from the real fan-in protocol (one group per host, claims with
host keys and the TCP asked for); each rank then opens its transport through
:class:`FanInMeeting` on a store client that counts its requests. The choice must be the
exchange rounds' in every case; no rank may list or wait on the job's ranks' keys; a rank
that never comes is named.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from shm_thread_ranks import MemoryExchange, run_on

from cclctl.errors import CommError, PeerError, RendezvousError
from cclctl.launch.launcher import launch
from cclctl.records import CollectiveRecord
from cclctl.runtime.hostagent import world_doc
from cclctl.runtime.hostagent.fanin import Claim, Where, join_group, run_blocking
from cclctl.runtime.hostagent.fanin_stores import BlockingStore
from cclctl.runtime.job.fanin_meeting import FanInMeeting
from cclctl.runtime.transport.base import Transport, Wait
from cclctl.runtime.transport.hybrid import build_transport
from cclctl.runtime.transport.shm import segment as shm_segment
from cclctl.runtime.transport.shm.layout import Layout
from cclctl.runtime.transport.tcp.links import Links
from cclctl.runtime.transport.tcp.transport import TcpTransport
from cclctl.runtime.transport.wire import Call
from cclctl.store.client import StoreClient
from cclctl.store.scope import ScopedStore
from cclctl.store.server import StoreServer
from scripts import script

pytestmark = pytest.mark.timeout(120)
JOB = "meet"


def small(local: int) -> Layout:
    return Layout(local, slots=2, slot_bytes=64 << 10, p2p_slots=2, p2p_bytes=16 << 10)


class Counting:
    """A store client that counts its requests by kind, and the most keys one named or
    listed."""

    def __init__(self, client: StoreClient) -> None:
        self.client = client
        self.ops: Counter[str] = Counter()
        self.widest = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def set(self, key: str, value: bytes) -> None:
        self.ops["set"] += 1
        self.client.set(key, value)

    def get(self, key: str, timeout_s: float | None = None) -> bytes:
        self.ops["get"] += 1
        return self.client.get(key, timeout_s)

    def try_get(self, key: str) -> bytes | None:
        self.ops["try_get"] += 1
        return self.client.try_get(key)

    def add(self, key: str, delta: int) -> int:
        self.ops["add"] += 1
        return self.client.add(key, delta)

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        self.ops["compare_set"] += 1
        return self.client.compare_set(key, expected, desired)

    def wait(self, keys: Sequence[str], timeout_s: float | None = None) -> None:
        self.ops["wait"] += 1
        self.widest = max(self.widest, len(keys))
        self.client.wait(keys, timeout_s)

    def list(self, prefix: str) -> dict[str, bytes]:
        self.ops["list"] += 1
        found = self.client.list(prefix)
        self.widest = max(self.widest, len(found))
        return found


def fanin_world(
    server: StoreServer, hosts: Sequence[str], keys: Sequence[str] = (), tcp: Sequence[int] = ()
) -> bytes:
    """The world document of a fan-in rendezvous: one group per host name, on threads."""
    n = len(hosts)
    docs: dict[int, str] = {}

    def group(host: str) -> None:
        claims = [Claim(r, 1000 + r, n, 10.0, keys[r] if keys else "k", r in tcp)
                  for r in range(n) if hosts[r] == host]  # fmt: skip
        with StoreClient("127.0.0.1", server.port, connect_timeout_s=5) as client:
            store = BlockingStore(ScopedStore.for_job(client, JOB))
            answers = run_blocking(join_group(store, host, claims, Where(JOB, client.address)))
        docs.update({rank: answer["world"] for rank, answer in answers.items()})

    threads = [threading.Thread(target=group, args=(h,), daemon=True) for h in set(hosts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(docs) == list(range(n)) and len(set(docs.values())) == 1
    return docs[0].encode()


class Met:
    """Each rank's transport (or error) and its store requests."""

    def __init__(self, n: int) -> None:
        self.out: list[Any] = [None] * n
        self.stores: list[Counting | None] = [None] * n
        self.clients: list[StoreClient] = []

    def transports(self) -> list[Transport]:
        assert not any(isinstance(t, BaseException) for t in self.out), self.out
        return [t for t in self.out if t is not None]

    def close(self) -> None:
        for t in self.out:
            if t is not None and not isinstance(t, BaseException):
                t.close()
        for client in self.clients:
            client.close()


def meet(
    server: StoreServer,
    doc: bytes,
    n: int,
    absent: Sequence[int] = (),
    timeout_s: float = 10.0,
) -> Met:
    """Every rank but ``absent`` opens its transport through a FanInMeeting over ``doc``."""
    world = world_doc.read(doc, n)
    met = Met(n)

    def rank(r: int) -> None:
        client = StoreClient("127.0.0.1", server.port, connect_timeout_s=5, timeout_s=30)
        met.clients.append(client)
        store = met.stores[r] = Counting(client)
        meeting = FanInMeeting(
            ScopedStore.for_job(store, JOB), r, n, world.keys, world.tcp, timeout_s
        )
        links = Links(r, n, JOB, "127.0.0.1", timeout_s, token="meet-token")
        local = sum(1 for key in world.keys if key == world.keys[r])
        try:
            met.out[r] = build_transport(
                r, n, JOB, meeting, links, choice="ignored", host="ignored",
                layout=small(local), spin_s=0.0,
            )  # fmt: skip
        except BaseException as exc:
            met.out[r] = exc

    threads = [
        threading.Thread(target=rank, args=(r,), daemon=True) for r in range(n) if r not in absent
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return met


def kinds(transports: Sequence[Any]) -> list[str]:
    return [type(t).__name__ for t in transports]


def exchange_kinds(hosts: Sequence[str], tcp: Sequence[int] = ()) -> list[str]:
    """What the exchange rounds choose for the same ranks (``tcp``: those that ask)."""
    n = len(hosts)
    exchange = MemoryExchange(n)
    out: list[Any] = [None] * n

    def rank(r: int) -> None:
        links = Links(r, n, JOB, "127.0.0.1", 10.0, token="meet-token")
        try:
            out[r] = build_transport(
                r, n, JOB, exchange.for_rank(r), links, choice="tcp" if r in tcp else "auto",
                host=hosts[r], layout=small(hosts.count(hosts[r])), spin_s=0.0,
            )  # fmt: skip
        except BaseException as exc:
            out[r] = exc

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        return kinds(out)
    finally:
        for t in out:
            if not isinstance(t, BaseException):
                t.close()


@pytest.mark.parametrize("n", [16, 32])
def test_each_rank_makes_a_constant_number_of_requests_and_reads_no_whole_world(
    server: StoreServer, n: int
) -> None:
    hosts = [f"h{r // 8}" for r in range(n)]  # hosts of 8 ranks: the hybrid transport
    met = meet(server, fanin_world(server, hosts), n)
    try:
        transports = met.transports()
        assert kinds(transports) == ["HybridTransport"] * n == exchange_kinds(hosts)
        meeting = [Counter(s.ops) for s in met.stores if s is not None]
        # a rank's all-reduce dials its peers across hosts: it reads only their addresses
        results = run_on(transports, lambda c: c.all_reduce(np.full(64, c.rank + 1.0)))
        assert all((res == n * (n + 1) / 2).all() for res in results)
    finally:
        met.close()
    stores = [s for s in met.stores if s is not None]
    for ops in meeting:
        # one address, the host's segment names (a set, a get of each of the 7 others'),
        # the verdict (set, add, get) and, for the last rank, the problems' list and the
        # verdict's write
        assert ops["set"] == 3 and ops["add"] == 1 and ops["get"] == 1 + 7, ops
        assert ops["wait"] == 0 and ops["list"] <= 1 and ops["compare_set"] <= 1, ops
    assert sum(ops.get("compare_set", 0) for ops in meeting) == 1  # one verdict, written once
    assert sum(ops["list"] for ops in meeting) == 1  # the last rank's, of the problems
    assert max(s.widest for s in stores) == 0  # no rank read a listing of the job's ranks
    # each rank fetched only the addresses of the peers it dialled (none in its host)
    assert max(s.ops["get"] for s in stores) - 8 <= 2


@pytest.mark.parametrize(
    ("hosts", "keys", "tcp"),
    [
        (["a"] * 4, (), ()),  # one host: shared memory
        (["a"] * 4, (), (2,)),  # one rank asks for TCP: every rank takes it
        (["a", "b", "a", "b"], (), ()),  # two hosts: hybrid
        (["a", "b", "c"], (), ()),  # nobody shares a host: TCP
        (["a"] * 4, ["k1", "k1", "k2", "k2"], ()),  # one host name, two machines: hybrid
    ],
)
def test_the_choice_is_the_exchange_rounds_choice(
    server: StoreServer, hosts: list[str], keys: list[str], tcp: tuple[int, ...]
) -> None:
    n = len(hosts)
    met = meet(server, fanin_world(server, hosts, keys, tcp), n)
    try:
        got = kinds(met.transports())
    finally:
        met.close()
    flat_hosts = [f"{h}|{keys[r]}" if keys else h for r, h in enumerate(hosts)]
    assert got == exchange_kinds(flat_hosts, tcp) and len(set(got)) == 1 and len(got) == n


def test_a_host_that_cannot_map_sends_every_rank_to_tcp(
    server: StoreServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    attach = shm_segment.Segment.attach

    def refusing(name: str) -> shm_segment.Segment:
        if "-r3-" in name:  # rank 3's segment cannot be mapped by its host's peers
            raise CommError(f"cannot open shared memory {name}: refused by the test")
        return attach(name)

    monkeypatch.setattr(shm_segment.Segment, "attach", staticmethod(refusing))
    hosts = ["a", "a", "b", "b"]
    met = meet(server, fanin_world(server, hosts), 4)
    try:
        assert kinds(met.transports()) == ["TcpTransport"] * 4
    finally:
        met.close()
    assert exchange_kinds(hosts) == ["TcpTransport"] * 4  # as the exchange rounds decide


def test_a_rank_that_never_publishes_its_address_fails_the_dial_naming_it(
    server: StoreServer,
) -> None:
    doc = fanin_world(server, ["a", "b", "c"])  # all on their own hosts: TCP, no verdict
    met = meet(server, doc, 3, absent=[2], timeout_s=0.5)
    try:
        tcp = met.out[0]
        assert isinstance(tcp, TcpTransport)
        call = Call(comm=1, epoch=0, seq=1, op="send", dtype="uint8", count=1)
        wait = Wait(rank=0, record=CollectiveRecord("c", 1, "send"), deadline=math.inf)
        with pytest.raises(PeerError) as failed:
            tcp.start(call, 0, [(2, memoryview(b"x"))], [], wait)
    finally:
        met.close()
    store = met.clients[0].address
    assert str(failed.value) == (
        "rank 0: no address of rank 2: exchange 'transport' timed out after 0.5s: rank 2 "
        f"of 3 never arrived (job '{JOB}', store {store})"
    )
    assert failed.value.fields["peer"] == 2


def test_a_rank_that_never_comes_is_named_by_every_rank(server: StoreServer) -> None:
    doc = fanin_world(server, ["a", "a", "b", "b"])
    met = meet(server, doc, 4, absent=[3], timeout_s=1.0)
    try:
        errors = met.out[:3]
    finally:
        met.close()
    assert all(isinstance(e, RendezvousError) for e in errors), errors
    # its host's peer waits for its segment; the other host, for its verdict
    assert "exchange 'shm/segments' timed out after 1s: rank 3 of 4 never arrived" in str(errors[2])
    for error in errors[:2]:
        assert "exchange 'shm/mapped' timed out after 1s: ranks 2-3 of 4 never arrived" in (
            str(error)
        )


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["1", "0"])
def test_a_launched_job_meets_through_the_world_document_with_its_agents(agent: str) -> None:
    """With host agents the ranks meet under ``transport/0/``; without, in the rounds."""
    lines: list[str] = []
    result = launch(
        [sys.executable, script("meet_worker.py")],
        4,
        env={"FAKE_HOSTS": "2", "CCLCTL_HOST_AGENT": agent},
        output=lambda rank, stream, line: lines.append(line),
        timeout_s=90,
    )
    assert result.returncode == 0, lines
    said = [json.loads(line) for line in lines if line.startswith('{"rank"')]
    assert sorted(s["rank"] for s in said) == [0, 1, 2, 3], lines
    assert {s["transport"] for s in said} == {"hybrid"}
    if agent == "1":
        assert all(s["fanin_keys"] > 0 and s["exchange_keys"] == 0 for s in said), said
    else:
        assert all(s["fanin_keys"] == 0 and s["exchange_keys"] > 0 for s in said), said
