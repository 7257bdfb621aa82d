"""A job's view of the store: every key lives under ``cclctl/<job>/``.

One store may outlive a job or serve several (a long-lived external store, a reused port),
so nothing of ours reads or writes a bare key: a stale key from another job is then simply
invisible instead of a wrong answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cclctl.store.kv import KeyValueStore


def job_prefix(job: str) -> str:
    """The namespace of one job's keys (``cclctl/<job>/``)."""
    return f"cclctl/{job}/"


class ScopedStore:
    """The store's API (:class:`~cclctl.store.kv.KeyValueStore`) with every key under one
    prefix (shares the client)."""

    def __init__(self, client: KeyValueStore, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    @classmethod
    def for_job(cls, client: KeyValueStore, job: str) -> ScopedStore:
        return cls(client, job_prefix(job))

    @property
    def address(self) -> str:
        return self.client.address

    @property
    def job(self) -> str:
        """The job whose keys these are (``cclctl/<job>/``), as messages name it."""
        return self.prefix.removeprefix("cclctl/").rstrip("/")

    @property
    def reconnects(self) -> int:
        """Connections the shared client reopened after losing one."""
        return self.client.reconnects

    def set(self, key: str, value: bytes) -> None:
        self.client.set(self.prefix + key, value)

    def set_many(self, items: Mapping[str, bytes]) -> None:
        self.client.set_many({self.prefix + key: value for key, value in items.items()})

    def get(self, key: str, timeout_s: float | None = None) -> bytes:
        return self.client.get(self.prefix + key, timeout_s)

    def try_get(self, key: str) -> bytes | None:
        return self.client.try_get(self.prefix + key)

    def add(self, key: str, delta: int) -> int:
        return self.client.add(self.prefix + key, delta)

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        return self.client.compare_set(self.prefix + key, expected, desired)

    def wait(self, keys: Sequence[str], timeout_s: float | None = None) -> None:
        self.client.wait([self.prefix + key for key in keys], timeout_s)

    def list(self, prefix: str) -> dict[str, bytes]:
        """Keys under ``prefix`` in this scope, returned without the scope's prefix."""
        cut = len(self.prefix)
        return {key[cut:]: value for key, value in self.client.list(self.prefix + prefix).items()}

    def delete(self, key: str) -> bool:
        return self.client.delete(self.prefix + key)
