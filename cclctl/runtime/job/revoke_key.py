"""The job's one revoke record in its store, as one rank reads and writes it.

The record lives under the job's ``revoke`` key (:mod:`cclctl.revocation`): the first
writer wins (compare-and-set), so the job agrees on one origin. A rank listens for it
through its host agent, which holds the host's one wait on the key
(:mod:`~cclctl.runtime.hostagent.revoke_feed`); where there is no agent, or it is gone, with
a blocking ``wait`` of its own, on a connection of its own, so the wait never holds up a
request of the failure path. Every request is bounded, so a store that is gone costs
seconds, never a hang. A rank process's one revoke end
(:mod:`~cclctl.runtime.job.revoke_end`), which cclctl's runtime and the PyTorch integration
share, reads and writes the record through this.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable

from cclctl import revocation
from cclctl.errors import BadInput, CclError, StoreTimeout
from cclctl.live.alike import ALIKE_FROM
from cclctl.live.snapshot import JobStatuses, fetch
from cclctl.revocation import Revocation
from cclctl.runtime.hostagent.revoke_feed import RevokeFeed
from cclctl.store.backends import open_store
from cclctl.store.kv import KeyValueStore
from cclctl.store.lazy import LazyStore
from cclctl.store.scope import ScopedStore

log = logging.getLogger(__name__)

LISTEN_SLICE_S = 30.0  # one blocking wait on the store; then it waits again
STORE_OP_S = 2.0  # the longest one request of the failure path may take
_GIVE_UP_AFTER = 5  # store errors in a row before a listener stops (the store is gone)
_WHERE = "the job's revoke record"


def read_record(scoped: ScopedStore) -> Revocation | None:
    """The job's record in ``scoped``; None if there is none or it cannot be read (a
    record this rank cannot read is none it can act on)."""
    raw = scoped.try_get(revocation.KEY)
    if not raw:
        return None
    try:
        return revocation.decode(raw, _WHERE)
    except CclError:
        return None


def _client(address: str, token: str, timeout_s: float) -> KeyValueStore:
    return open_store(
        address, timeout_s=timeout_s, connect_timeout_s=timeout_s, token=token or None
    )


class RevokeKey:
    """Rank ``rank``'s access to job ``job``'s revoke record in the store at ``address``
    (listened for through ``feed``, its host agent's fan-out, while that answers)."""

    def __init__(
        self, address: str, token: str, job: str, rank: int, feed: RevokeFeed | None = None
    ) -> None:
        self.job = job
        self.rank = rank
        self.feed = feed
        self._handed = False  # a record was handed on: the next ask is after a renewal
        self.scoped = ScopedStore.for_job(_client(address, token, STORE_OP_S), job)
        #: the rank's own listening connection: opened at once without an agent, else only
        #: once the agent does not answer (the store then holds none for this rank)
        listen_s = LISTEN_SLICE_S + STORE_OP_S
        self._listener = LazyStore(address, lambda: _client(address, token, listen_s), listen_s)
        self._listens = ScopedStore.for_job(self._listener, job)
        if feed is None:
            self._listener.open()

    def stored(self) -> Revocation | None:
        """The job's record, if one is there."""
        raw = self.scoped.try_get(revocation.KEY)
        return revocation.decode(raw, _WHERE) if raw else None

    def agree(self, record: Revocation) -> Revocation:
        """Write ``record`` as the job's record unless one is there; return the one that is."""
        mine = record.encode()
        now = self.scoped.compare_set(revocation.KEY, None, mine)
        if not now or now == mine:
            return record
        try:
            return revocation.decode(now, _WHERE)
        except BadInput:
            return record

    def withdraw(self, record: Revocation) -> None:
        """Remove the job's record if it is still ``record`` (a hang that ended)."""
        if self.scoped.try_get(revocation.KEY) == record.encode():
            self.scoped.delete(revocation.KEY)

    def ack(self, host: str, in_call: str) -> None:
        """Acknowledge the record under ``revoke_ack/<rank>`` (what ``cclctl abort`` reads)."""
        ack = {
            "rank": self.rank,
            "pid": os.getpid(),
            "host": host,
            "in_call": in_call,
            "time_ns": time.time_ns(),
        }
        self.scoped.set(revocation.ack_key(self.rank), json.dumps(ack).encode())

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        """The job's ``key`` set to ``desired`` if it holds ``expected`` (a hang's claim)."""
        return self.scoped.compare_set(key, expected, desired)

    def set(self, key: str, value: bytes) -> None:
        self.scoped.set(key, value)

    def try_get(self, key: str) -> bytes | None:
        return self.scoped.try_get(key)

    def statuses(self) -> JobStatuses:
        """Every rank's live status, in one listing (a large job's alike ranks parsed once,
        as ``diagnose hang --store`` reads them: :mod:`cclctl.live.alike`)."""
        return fetch(self.scoped.client, self.job, alike_from=ALIKE_FROM)

    def next_record(self, stopped: threading.Event) -> Revocation | None:
        """Block until the job has a record and return it; None once ``stopped`` is set,
        the store is gone (errors in a row) or the record cannot be read."""
        errors = 0
        while not stopped.is_set():
            slice_s = LISTEN_SLICE_S
            if self.feed is not None:
                raw = self.feed.next_record(fresh=self._handed)
                if stopped.is_set():
                    return None
                if raw is not None:
                    return self._decoded(raw)
                # no agent answers: wait on the store until the feed tries it again
                slice_s = min(LISTEN_SLICE_S, max(0.05, self.feed.retry_in()))
            try:
                self._listens.wait([revocation.KEY], timeout_s=slice_s)
                raw = self._listens.try_get(revocation.KEY)
            except StoreTimeout:
                continue
            except CclError:
                errors += 1
                if stopped.is_set() or errors >= _GIVE_UP_AFTER:
                    return None
                stopped.wait(0.2 * errors)
                continue
            if raw is None:
                continue  # withdrawn between the wait and the read
            return self._decoded(raw)
        return None

    def _decoded(self, raw: bytes) -> Revocation | None:
        self._handed = True
        try:
            return revocation.decode(raw, _WHERE)
        except BadInput as exc:
            log.warning("rank %d: ignored the store's revoke record: %s", self.rank, exc)
            return None

    def stop_listening(self) -> None:
        """End a blocking :meth:`next_record` at once (its connections close)."""
        if self.feed is not None:
            self.feed.close()
        self._listener.close()

    def close(self) -> None:
        self.stop_listening()
        self.scoped.client.close()


class RevokeListener:
    """A thread that hands the job's record to ``handle`` as it appears in ``key``, then
    waits for :meth:`renew` (its owner is ready for the next one: a retry or a shrink began a
    new life, a hang record was withdrawn) before it listens again. The listening loop of
    a rank process's revoke end (:class:`~cclctl.runtime.job.revoke_end.JobRevokeEnd`)."""

    def __init__(self, key: RevokeKey, handle: Callable[[Revocation], object], name: str):
        self._key = key
        self._handle = handle
        self._stopped = threading.Event()
        self._renewed = threading.Event()
        self._thread = threading.Thread(target=self._listen, name=name, daemon=True)
        self._thread.start()

    @property
    def stopped(self) -> threading.Event:
        """Set once the listener is closed (a wait on it ends then)."""
        return self._stopped

    def renew(self) -> None:
        """Listen again: the record handled last no longer holds this rank."""
        self._renewed.set()

    def _listen(self) -> None:
        while not self._stopped.is_set():
            record = self._key.next_record(self._stopped)
            if record is None:
                return
            self._handle(record)
            self._renewed.wait()
            self._renewed.clear()

    def close(self) -> None:
        """Stop listening and close the key's connections; the store may already be gone."""
        self._stopped.set()
        self._renewed.set()
        self._key.stop_listening()  # ends a blocking wait at once
        self._thread.join(2.0)
        self._key.close()
