"""Waiting for a value of every rank: the flat rendezvous' claims and the address exchange.

Each waiting rank waits on every rank's key and lists them once all are in, looking every
:data:`ERROR_POLL_S` for an error another rank reported, so it fails fast; a timeout names
the ranks that never wrote, folded.
"""

from __future__ import annotations

import time

from cclctl.errors import RendezvousError, StoreTimeout
from cclctl.ranges import fold_ranks
from cclctl.runtime.hostagent.fanin import Where, never_arrived
from cclctl.store.scope import ScopedStore

#: How often a waiting rank looks for an error another rank reported, so it fails fast.
ERROR_POLL_S = 0.5
ERROR_KEY = "rdzv/error"


def gather(
    scoped: ScopedStore, prefix: str, world_size: int, timeout_s: float, what: str
) -> list[bytes]:
    """Wait for ``prefix<rank>`` of every rank; values by rank, or an error naming the missing."""
    keys = [f"{prefix}{r}" for r in range(world_size)]
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        try:
            scoped.wait(keys, timeout_s=max(0.0, min(remaining, ERROR_POLL_S)))
        except StoreTimeout:
            _raise_reported(scoped, what)
            if remaining > ERROR_POLL_S:
                continue
            present = scoped.list(prefix)
            missing = [r for r, key in enumerate(keys) if key not in present]
            raise RendezvousError(
                never_arrived(
                    what, timeout_s, missing, world_size, Where(scoped.job, scoped.address)
                ),
                missing=fold_ranks(missing),
                elapsed=timeout_s,
            ) from None
        _raise_reported(scoped, what)  # everyone arrived, but maybe not everyone agreed
        found = scoped.list(prefix)
        return [found[key] for key in keys]


def _raise_reported(scoped: ScopedStore, what: str) -> None:
    reported = scoped.try_get(ERROR_KEY)
    if reported is not None:
        raise RendezvousError(f"{what} abandoned: {reported.decode(errors='replace')}")
