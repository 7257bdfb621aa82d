"""A transport's rendezvous in the job's store, for a communicator made after the job's own.

A shrink's survivors, a retry's renewed links and a torch ``new_group``'s members each open
a transport among a set of ranks that the job's rendezvous did not line up. The transport
asks its exchange to publish a value (an address, a host key) and get every member's, by
rank in the new communicator; each round lives under ``<prefix><key>/<round>/<rank>`` (a
key asked again starts a new round, as in the job's rendezvous). A member that never
writes is named by whoever made the exchange, which knows what its ranks mean.
"""

from __future__ import annotations

from collections.abc import Callable

from cclctl.errors import RendezvousError, StoreTimeout
from cclctl.store.scope import ScopedStore

#: what an exchange raises when ``missing`` (ranks in the new communicator) never wrote
#: round ``key``
Missing = Callable[[str, list[int]], RendezvousError]


class StoreExchange:
    """Publish a value, get every member's (``size`` of them, by rank), under ``prefix``."""

    def __init__(
        self,
        scoped: ScopedStore,
        prefix: str,
        rank: int,
        size: int,
        timeout_s: float,
        missing: Missing,
    ) -> None:
        self._scoped, self._prefix = scoped, prefix
        self._rank, self._size, self._timeout_s = rank, size, timeout_s
        self._missing = missing
        self._rounds: dict[str, int] = {}

    def __call__(self, key: str, value: bytes) -> list[bytes]:
        round_no = self._rounds.get(key, 0)
        self._rounds[key] = round_no + 1
        prefix = f"{self._prefix}{key}/{round_no}/"
        self._scoped.set(f"{prefix}{self._rank}", value)
        keys = [f"{prefix}{r}" for r in range(self._size)]
        try:
            self._scoped.wait(keys, timeout_s=self._timeout_s)
        except StoreTimeout:
            present = self._scoped.list(prefix)
            raise self._missing(key, [r for r, k in enumerate(keys) if k not in present]) from None
        found = self._scoped.list(prefix)
        return [found[k] for k in keys]
