"""The job's store as the fan-in protocol (:mod:`.fanin`) awaits it, over a blocking client.

:class:`BlockingStore` calls the client in the coroutine itself, for a rank that drives the
protocol alone (:func:`.fanin.run_blocking`, no event loop); :class:`ThreadedStore` calls
it on a worker thread, for the host agent's event loop, which serves its ranks meanwhile.
A blocking read holds its connection (the store answers a connection's requests in order),
so the agent's blocking reads go on a connection of their own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from cclctl.errors import StoreTimeout
from cclctl.store.scope import ScopedStore

#: a store, or the function that opens it
Opened = ScopedStore | Callable[[], ScopedStore]


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
    blocking reads over ``waiting`` (another connection). Either may be given as a function
    that opens it, called at its first use: an agent whose ranks never claim through it
    holds no connection for the rendezvous (a lingering store counts an idle one a rank's).
    """

    def __init__(self, scoped: Opened, waiting: Opened) -> None:
        self._given = (scoped, waiting)
        self._opened: list[ScopedStore | None] = [None, None]
        self._lock = threading.Lock()

    def _store(self, which: int) -> ScopedStore:
        with self._lock:
            found = self._opened[which]
            if found is None:
                given = self._given[which]
                found = given if isinstance(given, ScopedStore) else given()
                self._opened[which] = found
            return found

    async def set(self, key: str, value: bytes) -> None:
        await asyncio.to_thread(lambda: self._store(0).set(key, value))

    async def add(self, key: str, delta: int) -> int:
        return await asyncio.to_thread(lambda: self._store(0).add(key, delta))

    async def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        return await asyncio.to_thread(lambda: self._store(0).compare_set(key, expected, desired))

    async def get(self, key: str, timeout_s: float) -> bytes | None:
        return await asyncio.to_thread(lambda: get_or_none(self._store(1), key, timeout_s))

    async def list(self, prefix: str) -> dict[str, bytes]:
        return await asyncio.to_thread(lambda: self._store(0).list(prefix))


def get_or_none(scoped: ScopedStore, key: str, timeout_s: float) -> bytes | None:
    """``key``'s value once set, or None after ``timeout_s``."""
    try:
        return scoped.get(key, timeout_s=max(0.0, timeout_s))
    except StoreTimeout:
        return None
