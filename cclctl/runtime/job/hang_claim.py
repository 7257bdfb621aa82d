"""One diagnoser per hang: the first rank whose watchdog expires a call diagnoses it.

Every rank of a hung collective expires it at about the same time, and each would list
the job's statuses (one document per host, ~100 MB at 100,000 ranks) and run the full
diagnosis. Instead each names the hang (its communicator, life, call and seq) and
compare-and-sets ``diagnosis/<hang>`` in the job's store: the one that wins diagnoses
(and writes the job's revoke record, as before), then sets ``diagnosis/<hang>/done``.
The others wait for the record as every record reaches a rank (through the host agent's
one wait, :mod:`~cclctl.runtime.hostagent.revoke_fanout`, so a hang adds no store
watchers), at most a lease; then they read ``done``: where the claimer is through having
named nobody, they go on with their own view, as before; where it is not (it died, or is
late), one of them takes the claim over (compare-and-set of the claim it saw). A waiter
with no record by the time the claimer's asking ends reads ``done`` then already, so a
hang nobody is named for costs the waiters that asking, not the lease.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from cclctl.errors import CclError

PREFIX = "diagnosis/"
#: how many times a waiter takes over a claim that was not delivered, at most
TAKEOVERS = 2
T = TypeVar("T")


class ClaimStore(Protocol):
    """What a claim needs of the job's store (keys relative to the job)."""

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes: ...
    def set(self, key: str, value: bytes) -> None: ...
    def try_get(self, key: str) -> bytes | None: ...


def claim_key(hang: str) -> str:
    return f"{PREFIX}{hang}"


class HangClaim:
    """Rank ``rank``'s part in the diagnosis of the hang ``hang`` through ``store``: a
    claimer that has not delivered within ``lease_s`` is taken over."""

    def __init__(
        self, store: ClaimStore, rank: int, hang: str, lease_s: float, soon_s: float | None = None
    ) -> None:
        """``soon_s``: by when a claimer that names nobody is through (its asking): a waiter
        that has no record then and finds it through goes on, instead of waiting out the
        lease (None: the lease)."""
        self.store = store
        self.rank = rank
        self.key = claim_key(hang)
        self.lease_s = lease_s
        self.soon_s = lease_s if soon_s is None else min(soon_s, lease_s)
        self.diagnosed = False  # this rank ran the diagnosis
        self.waited = False  # this rank waited for another's

    def _mine(self) -> bytes:
        return json.dumps(
            {"rank": self.rank, "pid": os.getpid(), "time_ns": time.time_ns()}
        ).encode()

    def take(self, holder: bytes | None) -> tuple[bool, bytes]:
        """Claim the diagnosis if the claim is still ``holder`` (None: nobody's): whether
        this rank won, and the claim as it is now."""
        mine = self._mine()
        now = self.store.compare_set(self.key, holder, mine)
        return now == mine, now

    def finish(self) -> None:
        """The claimer is through: its waiters read the job's record now."""
        with contextlib.suppress(CclError):
            self.store.set(f"{self.key}/done", str(self.rank).encode())

    def through(self) -> bool:
        """Whether the claimer said it is through."""
        return self.store.try_get(f"{self.key}/done") is not None

    def run(
        self,
        diagnose: Callable[[], T | None],
        stored: Callable[[], T | None],
        handed: Callable[[float], T | None],
    ) -> T | None:
        """``diagnose()`` if this rank wins the claim (or takes it over); else the record
        the job's listener hands on within the lease (``handed(lease_s)``) or the job's
        record (``stored()``); None where the claimer is through and named none."""
        won, holder = self.take(None)
        for _ in range(TAKEOVERS + 1):
            if won:
                self.diagnosed = True
                try:
                    return diagnose()
                finally:
                    self.finish()
            self.waited = True
            found = handed(self.soon_s)
            if found is None and self.soon_s < self.lease_s and not self.through():
                found = handed(self.lease_s - self.soon_s)
            # "through" read before the record: a claimer through by then wrote its record
            # first, so a waiter never takes "through" with an older read of no record
            through = found is None and self.through()
            if found is None:
                found = stored()
            if found is not None or through:
                return found
            won, holder = self.take(holder)  # the claimer died or is late: take it over
        return stored()
