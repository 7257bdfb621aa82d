"""Every store request a host agent makes for its ranks' transport meeting is one the store
knows as an agent's (``store/access.AGENT_REQUESTS``): a connection that makes only those is
no rank's, so a lingering store does not wait for a host agent that outlives its ranks, nor
refuses a rerun's takeover for it (``tests/runtime/test_store_linger.py`` saw it refuse when
the meeting's keys were missing from the list)."""

from __future__ import annotations

import asyncio

import pytest

from cclctl.runtime.hostagent import meet_keys
from cclctl.runtime.hostagent.fanin import Where
from cclctl.store import access
from cclctl.store.protocol import Op

JOB = "meet-requests"


class Recording:
    """A FanInStore in memory that records each request as (op, the key under the job)."""

    def __init__(self) -> None:
        self.keys: dict[str, bytes] = {}
        self.asked: list[tuple[Op, str]] = []

    async def set(self, key: str, value: bytes) -> None:
        self.asked.append((Op.SET, key))
        self.keys[key] = value

    async def add(self, key: str, delta: int) -> int:
        self.asked.append((Op.ADD, key))
        now = int(self.keys.get(key, b"0")) + delta
        self.keys[key] = str(now).encode()
        return now

    async def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        self.asked.append((Op.COMPARE_SET, key))
        if self.keys.get(key) == expected:
            self.keys[key] = desired
        return self.keys[key]

    async def get(self, key: str, timeout_s: float) -> bytes | None:
        self.asked.append((Op.GET, key))
        return self.keys.get(key)

    async def list(self, prefix: str) -> dict[str, bytes]:
        self.asked.append((Op.LIST, prefix))
        return {k: v for k, v in self.keys.items() if k.startswith(prefix)}


async def _an_agents_meeting(store: Recording, ranks: list[int], size: int, lister: bool) -> None:
    where = Where(JOB, "127.0.0.1:1")
    await meet_keys.publish_addresses(store, meet_keys.host_tag("h|boot|dev"),
                                      {r: f"10.0.0.1:{4000 + r}" for r in ranks})  # fmt: skip
    await meet_keys.count_in(store, ranks, {ranks[-1]: "no writable /dev/shm"}, size)
    if lister:  # the count never reaches the world's size: the lister names who is missing
        await meet_keys.verdict(store, ranks, size + len(ranks), 0.0, where)
    else:
        await meet_keys.verdict(store, ranks, size, 0.0, where)


@pytest.mark.parametrize("ranks", [[0], [8, 9, 10, 11]], ids=["one rank", "a host of four"])
@pytest.mark.parametrize("lister", [False, True], ids=["counted", "lister at the timeout"])
def test_an_agents_meeting_requests_are_all_an_agents(ranks: list[int], lister: bool) -> None:
    store = Recording()
    asyncio.run(_an_agents_meeting(store, ranks, len(ranks), lister))
    kinds = {op for op, _ in store.asked}
    assert {Op.SET, Op.ADD, Op.COMPARE_SET, Op.GET} <= kinds  # the protocol ran its steps
    strangers = [
        (op.name, key)
        for op, key in store.asked
        if op not in access.READ_ONLY_OPS
        and not access.is_agents(op, [f"cclctl/{JOB}/{key}".encode()])
    ]
    assert strangers == []


def test_a_ranks_own_meeting_keys_are_not_an_agents() -> None:
    """A rank's own address key and segment name stay a rank's writes (its connection is a
    rank's, and the store lingers for it)."""
    for key in (f"{meet_keys.ADDRESS_PREFIX}3", f"{meet_keys.SEGMENT_PREFIX}abcd/3"):
        assert not access.is_agents(Op.SET, [f"cclctl/{JOB}/{key}".encode()])
