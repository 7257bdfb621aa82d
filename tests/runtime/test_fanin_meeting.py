"""The transport's meeting after a fan-in rendezvous, over a real store, thread ranks.

The world document comes from the real fan-in protocol (one group per host, claims with
host keys and the TCP asked for); each rank then opens its transport through
:class:`FanInMeeting` on a store client that counts its requests. The choice must be the
exchange rounds' in every case; no rank may list or wait on the job's ranks' keys; a rank
that never comes is named. Where the ranks joined through their host agents, each host's
agent is a real :class:`RendezvousService` on an event loop of its own (a thread), on its
own abstract socket, its store requests counted: a host makes a handful, its ranks none
but their dials' reads; a rank whose agent is gone, or that joined alone, meets through
the store beside its host's others, and the job still opens its transport.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from shm_thread_ranks import MemoryExchange, run_on

from cclctl.errors import CommError, PeerError, RendezvousError
from cclctl.launch.launcher import launch
from cclctl.records import CollectiveRecord
from cclctl.runtime.hostagent import meet_keys, world_doc
from cclctl.runtime.hostagent.fanin import Claim, Where, join_group, run_blocking
from cclctl.runtime.hostagent.fanin_stores import BlockingStore, ThreadedStore
from cclctl.runtime.hostagent.rendezvous import RendezvousService
from cclctl.runtime.job import fanin_meeting
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


class Agent:
    """A host agent's rendezvous service on an event loop of its own, listening on an
    abstract socket, its store requests counted (quick ones and blocking reads apart)."""

    def __init__(self, server: StoreServer, host: str) -> None:
        self.name = f"\0cclctl-test-meet-{os.getpid()}-{id(self)}-{host}"
        connect = lambda: StoreClient("127.0.0.1", server.port, connect_timeout_s=5, timeout_s=30)  # noqa: E731
        self.clients = [connect(), connect()]
        self.counted = [Counting(c) for c in self.clients]
        quick, waiting = (ScopedStore.for_job(c, JOB) for c in self.counted)  # type: ignore[arg-type]
        where = Where(JOB, self.clients[0].address)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def start() -> RendezvousService:
            service = RendezvousService(host, ThreadedStore(quick, waiting), where)
            self.listener = await service.serve(self.name)
            return service

        self.service = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)

    def ops(self) -> Counter[str]:
        return self.counted[0].ops + self.counted[1].ops

    def kill(self) -> None:
        """Stop listening: a rank that looks for the agent from now on finds none."""
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)

    async def _stop(self) -> None:
        self.listener.close()

    async def _end(self) -> None:
        """Stop listening, and end its connections' tasks (a rank's, left unanswered)."""
        await self._stop()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._end(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        for client in self.clients:
            client.close()


@pytest.fixture
def agents(server: StoreServer) -> Iterator[Callable[[Sequence[str]], dict[str, Agent]]]:
    """Start one agent per host name; all closed at the end."""
    made: list[Agent] = []

    def start(hosts: Sequence[str]) -> dict[str, Agent]:
        out = {h: Agent(server, h) for h in sorted(set(hosts))}
        made.extend(out.values())
        return out

    yield start
    for agent in made:
        agent.close()


def meet(
    server: StoreServer,
    doc: bytes,
    n: int,
    absent: Sequence[int] = (),
    timeout_s: float = 10.0,
    agents: Sequence[str] = (),
) -> Met:
    """Every rank but ``absent`` opens its transport through a FanInMeeting over ``doc``
    (``agents``: each rank's agent's socket, "" where it joined alone)."""
    world = world_doc.read(doc, n)
    met = Met(n)

    def rank(r: int) -> None:
        client = StoreClient("127.0.0.1", server.port, connect_timeout_s=5, timeout_s=30)
        met.clients.append(client)
        store = met.stores[r] = Counting(client)
        agent = agents[r] if agents else ""
        meeting = FanInMeeting(
            ScopedStore.for_job(store, JOB), r, n, world.keys, world.tcp, timeout_s, agent
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
        # one address and its host's (empty) document, the host's segment names (a set, a
        # get of each of the 7 others'), the verdict (set, add, get) and, for the last rank,
        # the problems' list and the verdict's write
        assert ops["set"] == 3 and ops["add"] == 1 and ops["get"] == 1 + 7, ops
        assert ops["wait"] == 0 and ops["list"] <= 1 and ops["compare_set"] <= 2, ops
    assert sum(ops.get("compare_set", 0) for ops in meeting) == n + 1  # one verdict, once
    assert sum(ops["list"] for ops in meeting) == 1  # the last rank's, of the problems
    assert max(s.widest for s in stores) == 0  # no rank read a listing of the job's ranks
    # each rank fetched only the addresses of the peers it dialled (none in its host): a
    # peer host's document, then the peer's own key (the document is empty)
    assert max(s.ops["get"] for s in stores) - 8 <= 4


HOST_REQUESTS: dict[int, list[int]] = {}


@pytest.mark.parametrize("n", [16, 32])
def test_through_the_agents_a_host_makes_a_handful_of_requests_and_its_ranks_none(
    server: StoreServer, agents: Callable[[Sequence[str]], dict[str, Agent]], n: int
) -> None:
    hosts = [f"h{r // 8}" for r in range(n)]
    started = agents(hosts)
    met = meet(server, fanin_world(server, hosts), n, agents=[started[h].name for h in hosts])
    try:
        transports = met.transports()
        assert kinds(transports) == ["HybridTransport"] * n == exchange_kinds(hosts)
        meeting = [Counter(s.ops) for s in met.stores if s is not None]
        per_host = [agent.ops() for agent in started.values()]
        results = run_on(transports, lambda c: c.all_reduce(np.full(64, c.rank + 1.0)))
        assert all((res == n * (n + 1) / 2).all() for res in results)
    finally:
        met.close()
    # a rank's own requests before its dials: none
    assert all(sum(ops.values()) == 0 for ops in meeting), meeting
    # a host: its addresses' document, its ranks' marker, one add, one read of the verdict;
    # the host whose add completes the count also lists the problems and writes the verdict
    for ops in per_host:
        assert ops["compare_set"] >= 1 and ops["set"] == 1 and ops["add"] == 1, ops
        assert ops["get"] == 1 and ops["wait"] == 0, ops
    totals = sorted(sum(ops.values()) for ops in per_host)
    assert totals == [4] * (len(per_host) - 1) + [6]
    HOST_REQUESTS[n] = totals
    if len(HOST_REQUESTS) == 2:  # the same at 16 and 32 ranks
        assert max(HOST_REQUESTS[16]) == max(HOST_REQUESTS[32])
    # a rank's dials read a peer host's document once, and no peer's own key
    stores = [s for s in met.stores if s is not None]
    assert max(s.ops["get"] for s in stores) <= n // 8 - 1 + 1


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
@pytest.mark.parametrize("through", ["agents", "store"])
def test_the_choice_is_the_exchange_rounds_choice(
    server: StoreServer,
    agents: Callable[[Sequence[str]], dict[str, Agent]],
    hosts: list[str],
    keys: list[str],
    tcp: tuple[int, ...],
    through: str,
) -> None:
    n = len(hosts)
    started = agents(hosts) if through == "agents" else {}
    names = [started[h].name for h in hosts] if started else []
    met = meet(server, fanin_world(server, hosts, keys, tcp), n, agents=names)
    try:
        got = kinds(met.transports())
    finally:
        met.close()
    flat_hosts = [f"{h}|{keys[r]}" if keys else h for r, h in enumerate(hosts)]
    assert got == exchange_kinds(flat_hosts, tcp) and len(set(got)) == 1 and len(got) == n


@pytest.mark.parametrize("through", ["agents", "store"])
def test_a_host_that_cannot_map_sends_every_rank_to_tcp(
    server: StoreServer,
    agents: Callable[[Sequence[str]], dict[str, Agent]],
    monkeypatch: pytest.MonkeyPatch,
    through: str,
) -> None:
    attach = shm_segment.Segment.attach

    def refusing(name: str) -> shm_segment.Segment:
        if "-r3-" in name:  # rank 3's segment cannot be mapped by its host's peers
            raise CommError(f"cannot open shared memory {name}: refused by the test")
        return attach(name)

    monkeypatch.setattr(shm_segment.Segment, "attach", staticmethod(refusing))
    hosts = ["a", "a", "b", "b"]
    started = agents(hosts) if through == "agents" else {}
    names = [started[h].name for h in hosts] if started else []
    met = meet(server, fanin_world(server, hosts), 4, agents=names)
    try:
        assert kinds(met.transports()) == ["TcpTransport"] * 4
    finally:
        met.close()
    if started:  # host b's agent wrote its ranks' problems once, for both, beside its marker
        assert started["b"].ops()["set"] == 2 and started["a"].ops()["set"] == 1
    assert exchange_kinds(hosts) == ["TcpTransport"] * 4  # as the exchange rounds decide


@pytest.mark.parametrize("through", ["agents", "store"])
def test_a_rank_that_never_publishes_its_address_fails_the_dial_naming_it(
    server: StoreServer, agents: Callable[[Sequence[str]], dict[str, Agent]], through: str
) -> None:
    hosts = ["a", "b", "c"]
    doc = fanin_world(server, hosts)  # all on their own hosts: TCP, no verdict
    started = agents(hosts) if through == "agents" else {}
    names = [started[h].name for h in hosts] if started else []
    met = meet(server, doc, 3, absent=[2], timeout_s=0.5, agents=names)
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


@pytest.mark.parametrize("through", ["agents", "store"])
def test_a_rank_that_never_comes_is_named_by_every_rank(
    server: StoreServer, agents: Callable[[Sequence[str]], dict[str, Agent]], through: str
) -> None:
    hosts = ["a", "a", "b", "b"]
    doc = fanin_world(server, hosts)
    started = agents(hosts) if through == "agents" else {}
    names = [started[h].name for h in hosts] if started else []
    met = meet(server, doc, 4, absent=[3], timeout_s=1.0, agents=names)
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


def _opens_as_the_rounds(met: Met, hosts: Sequence[str]) -> None:
    """Every rank opened the exchange rounds' transport, and an all-reduce goes through
    (its dials read the addresses wherever each peer published)."""
    n = len(hosts)
    transports = met.transports()
    assert kinds(transports) == exchange_kinds(hosts) and len(transports) == n
    results = run_on(transports, lambda c: c.all_reduce(np.full(8, c.rank + 1.0)))
    assert all((res == n * (n + 1) / 2).all() for res in results)


def test_ranks_whose_agent_was_killed_before_the_meeting_meet_through_the_store(
    server: StoreServer, agents: Callable[[Sequence[str]], dict[str, Agent]]
) -> None:
    hosts = ["a"] * 4 + ["b"] * 4
    started = agents(hosts)
    doc = fanin_world(server, hosts)
    started["b"].kill()  # between the rendezvous and the meeting
    met = meet(server, doc, 8, agents=[started[h].name for h in hosts], timeout_s=30.0)
    try:
        _opens_as_the_rounds(met, hosts)
    finally:
        met.close()
    assert sum(started["b"].ops().values()) == 0
    # host b's ranks met on their own: each its address and its segment name
    assert all(s is not None and s.ops["set"] == 3 for s in met.stores[4:])
    assert all(s is not None and s.ops["set"] == 0 for s in met.stores[:4])


def test_ranks_whose_agent_dies_in_the_meeting_meet_through_the_store(
    server: StoreServer, agents: Callable[[Sequence[str]], dict[str, Agent]]
) -> None:
    hosts = ["a"] * 4 + ["b"] * 4
    started = agents(hosts)
    dying = started["b"]
    handle = dying.service.meeting.handle

    async def dies_at_the_segments(body: dict[str, Any]) -> dict[str, Any]:
        if body["meet"] == "segments":  # it stops listening, and drops this connection
            await dying._stop()
            raise ConnectionError("the agent died")
        return await handle(body)

    dying.service.meeting.handle = dies_at_the_segments  # type: ignore[method-assign]
    met = meet(server, fanin_world(server, hosts), 8, agents=[started[h].name for h in hosts],
               timeout_s=30.0)  # fmt: skip
    try:
        _opens_as_the_rounds(met, hosts)
    finally:
        met.close()
    # its addresses went through it; the segment names and the verdict, through the store
    assert all(s is not None and s.ops["set"] == 2 for s in met.stores[4:])
    assert dying.ops()["compare_set"] == 1 and dying.ops()["add"] == 0


@pytest.mark.parametrize("how", ["says so", "dies"])
def test_ranks_whose_agent_fails_after_counting_them_in_are_counted_once(
    server: StoreServer, agents: Callable[[Sequence[str]], dict[str, Agent]], how: str
) -> None:
    """The agent writes its ranks' marker and adds them, then answers "go to the store" (its
    store's answer lost) or dies: its ranks find the marker and only read the verdict."""
    hosts = ["a"] * 4 + ["b"] * 4
    started = agents(hosts)
    failing = started["b"]
    answer = failing.service.meeting._answer

    async def fails_after_its_add(step: str, round_: Any, got: dict[int, str], done: bool) -> Any:
        if step != "mapped":
            return await answer(step, round_, got, done)
        await meet_keys.count_in(failing.service.meeting.store, sorted(got), got, round_.size)
        if how == "dies":  # its ranks' connections break
            await failing._stop()
            me = asyncio.current_task()
            for task in asyncio.all_tasks():
                if task is not me and "_connection" in task.get_coro().__qualname__:  # type: ignore[union-attr]
                    task.cancel()
        raise ConnectionError("the store's answer was lost")

    failing.service.meeting._answer = fails_after_its_add  # type: ignore[method-assign]
    met = meet(server, fanin_world(server, hosts), 8, agents=[started[h].name for h in hosts],
               timeout_s=30.0)  # fmt: skip
    try:
        _opens_as_the_rounds(met, hosts)
    finally:
        met.close()
    with StoreClient("127.0.0.1", server.port, connect_timeout_s=5) as client:
        assert ScopedStore.for_job(client, JOB).get(meet_keys.COUNT_KEY, 5) == b"8"
    # host b's ranks: one listing each (the markers), no add of their own
    assert all(s is not None and s.ops["list"] == 1 and s.ops["add"] == 0 for s in met.stores[4:])


@pytest.mark.parametrize("alone", [[1], [1, 2, 3]])
def test_a_host_whose_ranks_mix_the_agent_and_the_store_opens_its_transport(
    server: StoreServer, agents: Callable[[Sequence[str]], dict[str, Agent]], alone: list[int]
) -> None:
    """Ranks that joined alone beside their host's others that came through its agent: the
    agent's round of the segment names sends all of them to the store, and no rank waits
    on another for longer than the round's wait."""
    hosts = ["a"] * 4 + ["b"] * 4
    started = agents(hosts)
    names = ["" if r in alone else started[h].name for r, h in enumerate(hosts)]
    met = meet(server, fanin_world(server, hosts), 8, agents=names, timeout_s=4.0)
    try:
        _opens_as_the_rounds(met, hosts)
    finally:
        met.close()
    # every rank of host a exchanged its segment name through the store; host b's, not
    assert all(s is not None and s.ops["set"] >= 1 for s in met.stores[:4])
    assert all(s is not None and s.ops["set"] == 0 for s in met.stores[4:])
    # the host's agent counted its ranks in at once; host b's too
    assert started["a"].ops()["add"] == 1 and started["b"].ops()["add"] == 1


def test_an_agent_that_never_answers_fails_its_ranks_naming_it(
    server: StoreServer,
    agents: Callable[[Sequence[str]], dict[str, Agent]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fanin_meeting, "ANSWER_SLACK_S", 0.5)
    hosts = ["a", "a"]
    started = agents(hosts)
    never = asyncio.Event()

    async def silent(body: dict[str, Any]) -> dict[str, Any]:
        await never.wait()
        return {}

    started["a"].service.meeting.handle = silent  # type: ignore[method-assign]
    met = meet(server, fanin_world(server, hosts), 2, agents=[started["a"].name] * 2,
               timeout_s=1.0)  # fmt: skip
    met.close()
    assert all(isinstance(e, RendezvousError) for e in met.out), met.out
    for r, error in enumerate(met.out):
        assert str(error) == (
            f"rank {r}: the host agent (pid {os.getpid()}) gave no answer to the transport "
            "meeting's 'addr' within 1.5s"
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
        # host fake0's agent (local rank 0 starts it) carried its ranks' meeting
        assert not any(s["own_address"] for s in said if s["rank"] in (0, 2)), said
    else:
        assert all(s["fanin_keys"] == 0 and s["exchange_keys"] > 0 for s in said), said
