"""The rendezvous that fans in through the host agents, over a real store.

In this process: real :class:`RendezvousService` objects on real abstract sockets (one per
simulated host, on an event loop thread), thread ranks joining through them with
:func:`join_fanin`; every error the flat path reports is reported through the agents, in
its words. An agent that dies mid-rendezvous: its ranks join alone; one that never answers:
its ranks fail naming it. With real processes: ranks join through a real agent process, and
the flat path with ``CCLCTL_HOST_AGENT=0``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from ports import free_port

from cclctl.config import RuntimeConfig
from cclctl.errors import RendezvousError
from cclctl.runtime.hostagent.address import rendezvous_name, socket_name
from cclctl.runtime.hostagent.fanin import Claim, Where, join_group, run_blocking
from cclctl.runtime.hostagent.fanin_stores import BlockingStore, ThreadedStore
from cclctl.runtime.hostagent.rendezvous import RendezvousService
from cclctl.runtime.job import fanin_rank
from cclctl.runtime.job.fanin_rank import join_fanin
from cclctl.runtime.job.rendezvous import join_store
from cclctl.store.client import StoreClient
from cclctl.store.server import StoreServer

PID = os.getpid()


def cfg(host: str, job: str = "job", timeout_s: float = 10.0) -> RuntimeConfig:
    return RuntimeConfig(job=job, hostname=host, timeout_s=5.0, connect_timeout_s=timeout_s)


def scoped(server: StoreServer, job: str = "job") -> Any:
    from cclctl.store.scope import ScopedStore

    return ScopedStore.for_job(StoreClient("127.0.0.1", server.port, connect_timeout_s=5), job)


class Agent:
    """A host's rendezvous service on its own event loop thread, where the host's ranks
    look for it; ``serve`` may be replaced by a handler of the test's own."""

    def __init__(self, server: StoreServer, host: str, job: str = "job", handler: Any = None):
        self.clients = [scoped(server, job), scoped(server, job)]
        where = Where(job, self.clients[0].address)
        self.service = RendezvousService(host, ThreadedStore(*self.clients), where)
        name = rendezvous_name(socket_name(job, host, self.clients[0].address, ""))
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def main() -> None:
            self.server = await asyncio.start_unix_server(
                handler or self.service._connection, path=name
            )
            ready.set()

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(main(), self.loop).result(10)
        assert ready.wait(10)

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            rest = asyncio.all_tasks() - {asyncio.current_task()}
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        for client in self.clients:
            client.client.close()


@pytest.fixture
def agents(server: StoreServer) -> Iterator[dict[str, Agent]]:
    made: dict[str, Agent] = {}
    yield made
    for agent in made.values():
        agent.close()


def join_ranks(
    server: StoreServer, ranks: list[tuple[int, str, int]], world_size: int, **kw: Any
) -> list[Any]:
    """Ranks (rank, host, local world size) join on threads; a Joined or the error each."""
    out: list[Any] = [None] * len(ranks)

    def body(i: int, rank: int, host: str, local: int) -> None:
        store = scoped(server, kw.get("job", "job"))
        try:
            out[i] = join_fanin(store, rank, world_size, cfg(host, **kw), (1, local))
        except BaseException as exc:
            out[i] = exc
        finally:
            store.client.close()

    threads = [
        threading.Thread(target=body, args=(i, *r), daemon=True) for i, r in enumerate(ranks)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    return out


@pytest.mark.timeout(30)
def test_hosts_join_through_their_agents_with_one_group_each(
    server: StoreServer, agents: dict[str, Agent]
) -> None:
    for host in ("host-a", "host-b"):
        agents[host] = Agent(server, host)
    place = [(0, "host-a", 2), (1, "host-a", 2), (2, "host-b", 2), (3, "host-b", 2)]
    joined = join_ranks(server, place, 4)
    assert [j.hosts for j in joined] == [["host-a", "host-a", "host-b", "host-b"]] * 4
    assert [j.pids for j in joined] == [[PID] * 4] * 4
    assert all(j.via_agent for j in joined)
    with StoreClient("127.0.0.1", server.port) as client:
        keys = sorted(client.list("cclctl/job/rdzv/"))
    assert [k for k in keys if "/group/" in k] == [
        f"cclctl/job/rdzv/group/0.{PID}.2",
        f"cclctl/job/rdzv/group/2.{PID}.2",
    ]
    assert not any("/rank/" in k for k in keys)  # no rank's own claim: the hosts' groups
    assert [a.service.groups for a in agents.values()] == [1, 1]


@pytest.mark.timeout(30)
def test_a_rank_claimed_on_two_hosts_is_named_with_both(
    server: StoreServer, agents: dict[str, Agent]
) -> None:
    for host in ("host-a", "host-b"):
        agents[host] = Agent(server, host)
    outcomes = join_ranks(server, [(0, "host-a", 2), (1, "host-a", 2), (1, "host-b", 1)], 3)
    message = f"rank 1 is claimed twice: by host-a pid {PID} and host-b pid {PID}"
    alt = f"rank 1 is claimed twice: by host-b pid {PID} and host-a pid {PID}"
    assert all(isinstance(o, RendezvousError) for o in outcomes)
    said = {str(o) for o in outcomes}
    assert said in ({message, f"rendezvous abandoned: {message}"},
                    {alt, f"rendezvous abandoned: {alt}"})  # fmt: skip
    assert str(outcomes[0]).startswith("rendezvous abandoned: rank 1 is claimed twice")
    assert not str(outcomes[1]).startswith("rendezvous abandoned")  # its own claim


@pytest.mark.timeout(30)
def test_world_size_disagreement_through_agents_names_who_set_it_first(
    server: StoreServer, agents: dict[str, Agent]
) -> None:
    for host in ("host-a", "host-b"):
        agents[host] = Agent(server, host)
    first: list[Any] = []
    thread = threading.Thread(
        target=lambda: first.extend(join_ranks(server, [(0, "host-a", 1)], 2)), daemon=True
    )
    thread.start()
    with StoreClient("127.0.0.1", server.port) as client:
        client.get("cclctl/job/rdzv/world_size", timeout_s=10)  # host-a's group set it
    (second,) = join_ranks(server, [(1, "host-b", 1)], 3)
    thread.join(20)
    message = (
        f"world size disagreement: rank 1 (host-b pid {PID}) was started with world size 3, "
        f"but rank 0 (host-a pid {PID}) set it to 2 first"
    )
    assert str(second) == message and second.fields["world_size"] == 3
    assert str(first[0]) == f"rendezvous abandoned: {message}"


@pytest.mark.timeout(30)
def test_missing_ranks_are_named_folded_through_agents(
    server: StoreServer, agents: dict[str, Agent]
) -> None:
    for host in ("host-a", "host-b"):
        agents[host] = Agent(server, host, job="j")
    place = [(0, "host-a", 2), (1, "host-a", 2), (3, "host-b", 2), (4, "host-b", 2)]
    outcomes = join_ranks(server, place, 8, job="j", timeout_s=0.6)
    expected = (
        "rendezvous timed out after 0.6s: ranks 2,5-7 of 8 never arrived "
        f"(job 'j', store {server.address})"
    )
    assert [str(e) for e in outcomes] == [expected] * 4
    assert outcomes[0].fields["missing"] == "2,5-7"


@pytest.mark.timeout(30)
def test_ranks_whose_agent_dies_mid_rendezvous_join_alone(
    server: StoreServer, agents: dict[str, Agent]
) -> None:
    took: list[int] = []

    async def dying(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)  # a claim came; the agent dies before it answers
        took.append(1)
        writer.transport.abort()

    agents["host-a"] = Agent(server, "host-a", handler=dying)
    agents["host-b"] = Agent(server, "host-b")
    joined = join_ranks(server, [(0, "host-a", 2), (1, "host-a", 2), (2, "host-b", 1)], 3)
    assert [j.hosts for j in joined] == [["host-a", "host-a", "host-b"]] * 3
    assert [j.via_agent for j in joined] == [False, False, True]
    assert took == [1, 1]


@pytest.mark.timeout(30)
def test_a_claim_carried_twice_by_the_same_process_counts_once(server: StoreServer) -> None:
    """An agent wrote its host's group, then died; its first rank joins alone: the group
    stays (its key is not the rank's own) and the rank's claim counts once."""
    where = Where("job", f"127.0.0.1:{server.port}")
    out: dict[str, Any] = {}

    def group(name: str, claims: list[Claim]) -> None:
        store = scoped(server)
        try:
            out[name] = run_blocking(join_group(BlockingStore(store), "h", claims, where))
        finally:
            store.client.close()

    agent = threading.Thread(
        target=group, args=("agent", [Claim(0, 10, 3, 10), Claim(1, 11, 3, 10)])
    )
    agent.start()
    with StoreClient("127.0.0.1", server.port) as client:
        client.get("cclctl/job/rdzv/group/0.10.2", timeout_s=10)
    alone = threading.Thread(target=group, args=("alone", [Claim(0, 10, 3, 10)]))
    alone.start()
    with StoreClient("127.0.0.1", server.port) as client:
        client.get("cclctl/job/rdzv/group/0.10.1", timeout_s=10)
    group("last", [Claim(2, 12, 3, 10)])
    for thread in (agent, alone):
        thread.join(20)
    world = out["last"][2]["world"]
    assert out["agent"] == {0: {"world": world}, 1: {"world": world}}
    assert out["alone"] == {0: {"world": world}}
    assert json.loads(world)["hosts"] == [{"host": "h", "ranks": "0-2", "pids": "10+3"}]


@pytest.mark.timeout(30)
def test_an_agent_that_never_answers_is_named(
    server: StoreServer, agents: dict[str, Agent], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fanin_rank, "ANSWER_SLACK_S", 0.2)
    held = threading.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        held.set()
        await asyncio.sleep(60)  # holds the connection, never answers

    agents["host-a"] = Agent(server, "host-a", handler=silent)
    (outcome,) = join_ranks(server, [(0, "host-a", 1)], 1, timeout_s=0.3)
    assert held.is_set()
    assert str(outcome) == (
        f"rank 0: the host agent of host-a (pid {PID}) gave no rendezvous answer within 0.5s"
    )


@pytest.mark.timeout(30)
def test_a_job_that_mixes_the_paths_says_so(server: StoreServer, agents: dict[str, Agent]) -> None:
    agents["host-b"] = Agent(server, "host-b")
    flat: list[Any] = []

    def body() -> None:
        client = StoreClient("127.0.0.1", server.port)
        try:
            flat.append(join_store(client, 0, 2, cfg("host-a")))
        except RendezvousError as exc:
            flat.append(exc)
        finally:
            client.close()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    with StoreClient("127.0.0.1", server.port) as client:
        client.get("cclctl/job/rdzv/world_size", timeout_s=10)
    (fanned,) = join_ranks(server, [(1, "host-b", 1)], 2)
    thread.join(20)
    assert str(fanned) == (
        f"rendezvous path disagreement: rank 1 (host-b pid {PID}) joins through its host "
        f"agent, but rank 0 (host-a pid {PID}) joined without one: set the same "
        "CCLCTL_HOST_AGENT on every rank"
    )
    assert str(flat[0]).startswith("rendezvous abandoned: rendezvous path disagreement")


RANK_SCRIPT = """
import json
from cclctl.config import rendezvous_from_env, runtime_from_env
from cclctl.runtime.job.rendezvous import join
rdzv = join(rendezvous_from_env(), runtime_from_env())
keys = sorted(rdzv.job_store.list("rdzv/"))
print(json.dumps({"rank": rdzv.rank, "pids": rdzv.pids, "keys": keys}), flush=True)
rdzv.close()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("agent", ["1", "0"])
def test_processes_join_with_the_agent_on_and_off(agent: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCLCTL_", "TORCHELASTIC"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="4",
               LOCAL_WORLD_SIZE="4", CCLCTL_JOB=f"fanin{agent}", CCLCTL_CONNECT_TIMEOUT="20",
               CCLCTL_STORE_LINGER="1", CCLCTL_HOST_AGENT=agent)  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
        )
        for r in range(4)
    ]
    try:
        outs = [(p.wait(40), p.stdout.read() if p.stdout else "") for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [code for code, _ in outs] == [0] * 4
    reports = [json.loads(out) for _, out in outs]
    assert [r["pids"] for r in reports] == [[p.pid for p in procs]] * 4
    groups = [k for k in reports[0]["keys"] if k.startswith("rdzv/group/")]
    claims = [k for k in reports[0]["keys"] if k.startswith("rdzv/rank/")]
    if agent == "1":  # the host's four claims, as one group from its agent
        assert (len(groups), claims) == (1, [])
    else:
        assert (groups, len(claims)) == ([], 4)


@pytest.mark.timeout(30)
def test_a_rank_late_to_its_host_joins_in_a_group_of_its_own(
    server: StoreServer, agents: dict[str, Agent], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cclctl.runtime.hostagent import rendezvous

    monkeypatch.setattr(rendezvous, "FLUSH_S", 0.05)
    agents["host-a"] = Agent(server, "host-a")
    first: list[Any] = []
    thread = threading.Thread(
        target=lambda: first.extend(join_ranks(server, [(0, "host-a", 2)], 2)), daemon=True
    )
    thread.start()
    with StoreClient("127.0.0.1", server.port) as client:  # its batch went without rank 1
        client.get(f"cclctl/job/rdzv/group/0.{PID}.1", timeout_s=10)
    (late,) = join_ranks(server, [(1, "host-a", 2)], 2)
    thread.join(20)
    assert late.hosts == first[0].hosts == ["host-a", "host-a"]
    assert agents["host-a"].service.groups == 2


@pytest.mark.timeout(30)
def test_the_agents_carry_each_claims_host_key_and_tcp_asked_into_the_world(
    server: StoreServer, agents: dict[str, Agent], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the transport's choice needs comes back in the world document: rank 1 asked for
    TCP; host-b's two ranks are on two machines (two keys), so its entry is split."""
    for host in ("host-a", "host-b"):
        agents[host] = Agent(server, host)
    mine = threading.local()
    monkeypatch.setattr(fanin_rank, "host_key", lambda: mine.key)
    place = [(0, "host-a", "auto", "k1"), (1, "host-a", "tcp", "k1"),
             (2, "host-b", "auto", "k2"), (3, "host-b", "auto", "k3")]  # fmt: skip
    out: list[Any] = [None] * 4

    def body(rank: int, host: str, transport: str, key: str) -> None:
        mine.key = key
        store = scoped(server)
        try:
            config = cfg(host).replace(transport=transport)
            out[rank] = join_fanin(store, rank, 4, config, (1, 2))  # no agent to start
        except BaseException as exc:
            out[rank] = exc
        finally:
            store.client.close()

    threads = [threading.Thread(target=body, args=p, daemon=True) for p in place]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(j.via_agent for j in out), out
    assert [j.keys for j in out] == [["host-a", "host-a", "host-b\0k2", "host-b\0k3"]] * 4
    assert [j.tcp for j in out] == [[1]] * 4
    assert [j.hosts for j in out] == [["host-a", "host-a", "host-b", "host-b"]] * 4
