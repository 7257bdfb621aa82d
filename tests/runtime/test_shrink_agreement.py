"""The survivors' agreement on a shrink, on a real store: who is in, and what each saw.

Threads stand in for ranks (the agreement is store requests only); the dead rank is never
waited on, a silent one is left out at the deadline, and one that comes after the decision
is told it was left out.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from cclctl.errors import CommError
from cclctl.runtime.job.shrink import Agreement, Joined, ShrinkExchange, agree
from cclctl.store.client import StoreClient, StoreServer
from cclctl.store.scope import ScopedStore


@pytest.fixture
def server() -> Iterator[StoreServer]:
    srv = StoreServer("127.0.0.1", 0).start()
    try:
        yield srv
    finally:
        srv.close()


def _scoped(server: StoreServer) -> ScopedStore:
    return ScopedStore.for_job(StoreClient("127.0.0.1", server.port, timeout_s=10), "job")


def _agree_all(
    server: StoreServer, ranks: list[int], world: int, excluded: frozenset[int], wait_s: float
) -> dict[int, Agreement]:
    found: dict[int, Agreement] = {}

    def one(rank: int) -> None:
        found[rank] = agree(_scoped(server), 1, world, Joined(rank, 4 + rank % 2, 4, "all_reduce"),
                            excluded, wait_s)  # fmt: skip

    threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return found


def test_the_dead_rank_is_not_waited_on(server: StoreServer) -> None:
    # a deadline no test would reach: leaving rank 2 out must not depend on it
    found = _agree_all(server, [0, 1, 3], 4, frozenset({2}), wait_s=60)
    assert {r: a.members for r, a in found.items()} == {r: [0, 1, 3] for r in (0, 1, 3)}
    assert found[0].entries[3] == Joined(3, 5, 4, "all_reduce")


def test_a_silent_rank_is_left_out_at_the_deadline_and_refused_after(
    server: StoreServer,
) -> None:
    found = _agree_all(server, [0, 1, 2], 4, frozenset(), wait_s=0.5)
    assert [a.members for a in found.values()] == [[0, 1, 2]] * 3
    with pytest.raises(CommError, match=r"rank 3: left out of shrink 1: .* ranks 0-2"):
        agree(_scoped(server), 1, 4, Joined(3, 4, 4), frozenset(), 0.5)


def test_the_shrinks_exchange_gives_every_survivors_value_by_new_rank(
    server: StoreServer,
) -> None:
    got: dict[int, list[bytes]] = {}

    def one(rank: int) -> None:
        exchange = ShrinkExchange(_scoped(server), 1, rank, 3, 10)
        exchange("k", b"old")
        got[rank] = exchange("k", f"v{rank}".encode())  # a second round: no stale value

    threads = [threading.Thread(target=one, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == {r: [b"v0", b"v1", b"v2"] for r in range(3)}
