"""One diagnoser per hang: the first rank whose watchdog expires a call diagnoses it.

Every rank of a hung collective expires it at about the same time, and each would list
the job's statuses (one document per host, ~100 MB at 100,000 ranks) and run the full
diagnosis. Instead each names the hang (its communicator, life, call and seq) and
compare-and-sets ``diagnosis/<hang>`` in the job's store: the one that wins diagnoses
(and writes the job's revoke record, as before); the others wait for ``diagnosis/<hang>/done``,
which the claimer writes when it is through, and take the job's record (or, where the
claimer named nobody, their own view, as before). A claimer that dies or is late past
its lease is taken over: a waiter compare-and-sets the claim it saw to its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from cclctl.errors import CclError, StoreTimeout

PREFIX = "diagnosis/"
#: how many times a waiter takes over a claim that was not delivered, at most
TAKEOVERS = 2
T = TypeVar("T")


class ClaimStore(Protocol):
    """What a claim needs of the job's store (keys relative to the job)."""

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes: ...
    def set(self, key: str, value: bytes) -> None: ...
    def wait_for(self, key: str, timeout_s: float) -> bool: ...


def claim_key(hang: str) -> str:
    return f"{PREFIX}{hang}"


class HangClaim:
    """Rank ``rank``'s part in the diagnosis of the hang ``hang`` through ``store``: a
    claimer that has not delivered within ``lease_s`` is taken over."""

    def __init__(self, store: ClaimStore, rank: int, hang: str, lease_s: float) -> None:
        self.store = store
        self.rank = rank
        self.key = claim_key(hang)
        self.lease_s = lease_s
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

    def done(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the claimer to be through; False if it is not."""
        try:
            return self.store.wait_for(f"{self.key}/done", timeout_s)
        except StoreTimeout:
            return False

    def run(self, diagnose: Callable[[], T | None], stored: Callable[[], T | None]) -> T | None:
        """``diagnose()`` if this rank wins the claim (or takes it over), else the job's
        record (``stored()``) once the claimer is through; None where neither names one."""
        won, holder = self.take(None)
        for _ in range(TAKEOVERS + 1):
            if won:
                self.diagnosed = True
                try:
                    return diagnose()
                finally:
                    self.finish()
            self.waited = True
            through = self.done(self.lease_s)
            found = stored()
            if found is not None or through:
                return found
            won, holder = self.take(holder)  # the claimer died or is late: take it over
        return stored()
