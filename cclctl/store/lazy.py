"""A store client that connects at its first request, for a connection a rank may never need.

A rank whose host agent carries its status, its dump requests and the job's revoke record
uses its status link's connection and its revoke listener's only when the agent is not
there (none yet, or it died) and at its last status; opening them only then spares the
store two connections per rank, which at 100,000 ranks is 200,000."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

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

    def open(self) -> None:
        """Connect now (a request would anyway)."""
        self._store()

    def _store(self) -> KeyValueStore:
        """The connection, opened on first use outside the lock, so a :meth:`close` meanwhile
        returns at once (the connection it was opening is closed, and the request fails)."""
        with self._lock:
            self._check_open()
            if self._client is not None:
                return self._client
        client = self._opener()
        with self._lock:
            if self._client is None and not self._closed:
                self._client = client
                return client
            kept, closed = self._client, self._closed
        client.close()  # closed meanwhile, or another request opened one first
        if closed or kept is None:
            raise self._closed_error()
        return kept

    def _check_open(self) -> None:
        if self._closed:
            raise self._closed_error()

    def _closed_error(self) -> StoreError:
        return StoreError(f"the connection to the store at {self._address} is closed")

    def set(self, key: str, value: bytes) -> None:
        self._store().set(key, value)

    def set_many(self, items: Mapping[str, bytes]) -> None:
        self._store().set_many(items)

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
