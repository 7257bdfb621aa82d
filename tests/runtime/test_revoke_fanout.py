"""The revoke record through the host agent: one store wait per host, handed to its ranks.

In this process: a :class:`RevokeFanout` on its own event loop against a real store, and
ranks' :class:`RevokeKey` listeners that ask it (:class:`RevokeFeed`). Every rank gets the
record; the store sees one wait for the host; a rank whose agent is gone, or never came,
still gets it from the store itself; after a renewal a rank gets the next record.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from cclctl import revocation
from cclctl.errors import StoreTimeout
from cclctl.revocation import Revocation
from cclctl.runtime.hostagent.address import socket_name
from cclctl.runtime.hostagent.revoke_fanout import RevokeFanout, fanout_name
from cclctl.runtime.hostagent.revoke_feed import RevokeFeed
from cclctl.runtime.job.revoke_key import RevokeKey, RevokeListener
from cclctl.store.client import StoreClient
from cclctl.store.scope import ScopedStore
from cclctl.store.server import StoreServer

pytestmark = pytest.mark.timeout(60)
WAIT_S = 10.0  # a bound on an event the test waits for, never a pace
JOB = "fanjob"
RANKS = 8


class _FanoutThread:
    """A host agent's fan-out on its own event loop thread, waiting on the real store."""

    def __init__(self, address: str, name: str) -> None:
        self.client = StoreClient.from_address(address, timeout_s=40, connect_timeout_s=5)
        self.reader = StoreClient.from_address(address, timeout_s=10, connect_timeout_s=5)
        self.store = ScopedStore.for_job(self.client, JOB)  # the wait's
        reads = ScopedStore.for_job(self.reader, JOB)  # as the agent: reads pass the wait
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        ready = threading.Event()

        async def wait(timeout_s: float) -> bytes | None:
            try:
                return await asyncio.to_thread(self.store.get, revocation.KEY, timeout_s)
            except StoreTimeout:
                return None

        async def read() -> bytes | None:
            return await asyncio.to_thread(reads.try_get, revocation.KEY)

        async def main() -> None:
            self.fanout = RevokeFanout(wait, read, poll_s=0.05)
            await self.fanout.serve(name)
            ready.set()
            await self.fanout.run(self.stop)
            self.fanout.close()

        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(main(),))
        self.thread.start()
        assert ready.wait(WAIT_S)

    def close(self) -> None:
        """The agent ends (its connections close), as it does when it is killed."""
        self.loop.call_soon_threadsafe(self.stop.set)
        self.client.close()  # ends the blocking wait
        self.thread.join(WAIT_S)
        self.reader.close()
        self.loop.close()


class _Rank:
    """One rank's listener: every record it hands on goes to ``got``."""

    def __init__(self, address: str, rank: int, name: str) -> None:
        self.feed = RevokeFeed(name)
        self.key = RevokeKey(address, "", JOB, rank, self.feed)
        self.got: queue.Queue[Revocation] = queue.Queue()
        self.listener = RevokeListener(self.key, self.got.put, f"test-r{rank}")

    def next(self) -> Revocation:
        return self.got.get(timeout=WAIT_S)


def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.01)


@pytest.fixture
def host() -> Iterator[tuple[StoreServer, str, ScopedStore]]:
    with StoreServer() as server:
        name = fanout_name(socket_name(f"fan-{os.getpid()}-{time.monotonic_ns()}", "h"))
        with StoreClient("127.0.0.1", server.port, timeout_s=10) as client:
            yield server, name, ScopedStore.for_job(client, JOB)


def _ranks(server: StoreServer, name: str) -> list[_Rank]:
    return [_Rank(server.address, rank, name) for rank in range(RANKS)]


def _close(ranks: list[_Rank]) -> None:
    for rank in ranks:
        rank.listener.close()


def test_every_rank_gets_the_record_through_the_hosts_one_wait(host) -> None:
    server, name, store = host
    agent = _FanoutThread(server.address, name)
    ranks = _ranks(server, name)
    try:
        _until(lambda: agent.fanout.subscribers == RANKS)
        record = Revocation("aborted", 3, "by the operator", seen_by=3)
        store.compare_set(revocation.KEY, None, record.encode())
        assert [rank.next() for rank in ranks] == [record] * RANKS
        assert [rank.feed.delivered for rank in ranks] == [1] * RANKS  # none waited itself
        assert agent.fanout.waits == 1  # the store held one wait for the host's 8 ranks
    finally:
        _close(ranks)
        agent.close()


def test_after_a_renewal_a_rank_gets_the_next_record(host) -> None:
    server, name, store = host
    agent = _FanoutThread(server.address, name)
    (rank,) = [_Rank(server.address, 0, name)]
    try:
        first = Revocation("hang", 2, "stuck", seen_by=0)
        store.compare_set(revocation.KEY, None, first.encode())
        assert rank.next() == first
        store.delete(revocation.KEY)  # a retry cleared it, then the rank renews
        rank.listener.renew()
        second = Revocation("aborted", 1, "by the operator", seen_by=1)
        store.compare_set(revocation.KEY, None, second.encode())
        assert rank.next() == second
        assert rank.feed.delivered == 2
    finally:
        rank.listener.close()
        agent.close()


def test_ranks_whose_agent_is_gone_get_the_record_from_the_store(host) -> None:
    """The agent is killed once its ranks asked it; a record written after still reaches
    every rank, through the store's own wait of each."""
    server, name, store = host
    agent = _FanoutThread(server.address, name)
    ranks = _ranks(server, name)
    try:
        _until(lambda: agent.fanout.subscribers == RANKS)
        agent.close()
        _until(lambda: all(rank.feed.lost for rank in ranks))
        record = Revocation("died", 5, "process exited", seen_by=0)
        store.compare_set(revocation.KEY, None, record.encode())
        assert [rank.next() for rank in ranks] == [record] * RANKS
        assert [rank.feed.delivered for rank in ranks] == [0] * RANKS
    finally:
        _close(ranks)


def test_a_rank_whose_agent_never_came_waits_on_the_store_and_moves_over_once_it_listens(
    host,
) -> None:
    server, name, store = host
    rank = _Rank(server.address, 0, name)
    agent = None
    try:
        first = Revocation("hang", 2, "stuck", seen_by=0)
        store.compare_set(revocation.KEY, None, first.encode())
        assert rank.next() == first  # from the store itself: no agent listens
        assert rank.feed.delivered == 0
        agent = _FanoutThread(server.address, name)
        store.delete(revocation.KEY)
        rank.listener.renew()
        _until(lambda: agent.fanout.subscribers == 1)  # the rank's next try reaches it
        second = Revocation("aborted", 1, "by the operator", seen_by=1)
        store.compare_set(revocation.KEY, None, second.encode())
        assert rank.next() == second
        assert rank.feed.delivered == 1
    finally:
        rank.listener.close()
        if agent is not None:
            agent.close()
