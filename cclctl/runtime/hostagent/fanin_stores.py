"""The job's store as the fan-in protocol (:mod:`.fanin`) awaits it, over a blocking client.

:class:`BlockingStore` calls the client in the coroutine itself, for a rank that drives the
protocol alone (:func:`.fanin.run_blocking`, no event loop); :class:`ThreadedStore` calls
it on a worker thread, for the host agent's event loop, which serves its ranks meanwhile.
A blocking read holds its connection (the store answers a connection's requests in order),
so the agent's blocking reads go on a connection of their own.
"""

from __future__ import annotations

import asyncio

from cclctl.errors import StoreTimeout
from cclctl.store.scope import ScopedStore


class BlockingStore:
    """:class:`~.fanin.FanInStore` over ``scoped``, blocking in the coroutine."""

    def __init__(self, scoped: ScopedStore) -> None:
        self.scoped = scoped

    async def set(self, key: str, value: bytes) -> None:
        self.scoped.set(key, value)

    async def add(self, key: str, delta: int) -> int:
        return self.scoped.add(key, delta)

    async def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        return self.scoped.compare_set(key, expected, desired)

    async def get(self, key: str, timeout_s: float) -> bytes | None:
        return get_or_none(self.scoped, key, timeout_s)

    async def list(self, prefix: str) -> dict[str, bytes]:
        return self.scoped.list(prefix)


class ThreadedStore:
    """:class:`~.fanin.FanInStore` over ``scoped``, each call on a worker thread, and the
    blocking reads over ``waiting`` (another connection)."""

    def __init__(self, scoped: ScopedStore, waiting: ScopedStore) -> None:
        self.blocking = BlockingStore(scoped)
        self.waiting = waiting

    async def set(self, key: str, value: bytes) -> None:
        await asyncio.to_thread(self.blocking.scoped.set, key, value)

    async def add(self, key: str, delta: int) -> int:
        return await asyncio.to_thread(self.blocking.scoped.add, key, delta)

    async def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        return await asyncio.to_thread(self.blocking.scoped.compare_set, key, expected, desired)

    async def get(self, key: str, timeout_s: float) -> bytes | None:
        return await asyncio.to_thread(get_or_none, self.waiting, key, timeout_s)

    async def list(self, prefix: str) -> dict[str, bytes]:
        return await asyncio.to_thread(self.blocking.scoped.list, prefix)


def get_or_none(scoped: ScopedStore, key: str, timeout_s: float) -> bytes | None:
    """``key``'s value once set, or None after ``timeout_s``."""
    try:
        return scoped.get(key, timeout_s=max(0.0, timeout_s))
    except StoreTimeout:
        return None
