"""A store client that connects at its first request, for a connection a rank may never need.

A rank whose host agent carries its status and dump requests uses its status link's own
store connection only when the agent is not there (none yet, or it died) and at its last
status; opening that connection only then spares the store one connection per rank, which
at 100,000 ranks is 100,000.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from cclctl.errors import StoreError
from cclctl.store.backends import endpoint_of
from cclctl.store.kv import KeyValueStore


class LazyStore:
    """The store at ``address``, opened by ``opener`` at the first request (a
    :class:`~cclctl.store.kv.KeyValueStore` itself); thread-safe."""

    def __init__(self, address: str, opener: Callable[[], KeyValueStore], timeout_s: float) -> None:
        self._address = address
        self.host, self.port = endpoint_of(address)
        self._timeout_s = timeout_s
        self._opener = opener
        self._client: KeyValueStore | None = None
        self._closed = False
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return self._address

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    @property
    def opened(self) -> bool:
        """Whether a request opened the connection yet."""
        return self._client is not None

    @property
    def reconnects(self) -> int:
        return 0 if self._client is None else self._client.reconnects

    def _store(self) -> KeyValueStore:
        with self._lock:
            if self._closed:
                raise StoreError(f"the connection to the store at {self._address} is closed")
            if self._client is None:
                self._client = self._opener()
            return self._client

    def set(self, key: str, value: bytes) -> None:
        self._store().set(key, value)

    def get(self, key: str, timeout_s: float | None = None) -> bytes:
        return self._store().get(key, timeout_s)

    def try_get(self, key: str) -> bytes | None:
        return self._store().try_get(key)

    def add(self, key: str, delta: int) -> int:
        return self._store().add(key, delta)

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        return self._store().compare_set(key, expected, desired)

    def wait(self, keys: Sequence[str], timeout_s: float | None = None) -> None:
        self._store().wait(keys, timeout_s)

    def list(self, prefix: str) -> dict[str, bytes]:
        return self._store().list(prefix)

    def delete(self, key: str) -> bool:
        return self._store().delete(key)

    def close(self) -> None:
        """Close the connection if a request opened it; later requests fail."""
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __enter__(self) -> LazyStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
