"""A rank process's one end of its job's revoke record, shared by every front end of the rank.

One store connection pair (:class:`~cclctl.runtime.job.revoke_key.RevokeKey`) and one
listening thread per rank in a process, whatever front ends run in it: cclctl's
communicators (:class:`~cclctl.runtime.job.revoker.Revoker`) and the torch process-group
wrapper (:class:`~cclctl.integrations.torch.revoke.TorchRevoke`) follow it. The end hands
every record the job writes to each follower, writes the job's record (first writer wins)
and withdraws it for them, makes this rank's documents carry the record a follower adopted,
and asks the live diagnosis which rank a hang waits on. A front end supplies only what
differs: what its failures are and how it learns of them.

A watchdog that expires a call asks the diagnosis at once, when the statuses may not show
the hang yet (a status publisher that ran late under load): the end asks again every half
status interval, for up to two intervals, before the front end falls back to its own view.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from cclctl.config import RuntimeConfig
from cclctl.live.snapshot import JobStatuses
from cclctl.revocation import Revocation
from cclctl.runtime.hostagent.address import socket_name
from cclctl.runtime.hostagent.revoke_fanout import fanout_name
from cclctl.runtime.hostagent.revoke_feed import RevokeFeed
from cclctl.runtime.job.hang_claim import HangClaim
from cclctl.runtime.job.revoke_key import RevokeKey, RevokeListener

log = logging.getLogger(__name__)

#: (rank, kind, reason, peer, symptom): the live diagnosis' first suspect of a hang
Suspect = tuple[int, str, str, int | None, str]
Handler = Callable[[Revocation], object]
Carried = Callable[[], Revocation | None]
#: how a front end makes its record of the diagnosis' suspect (the statuses it read with it)
Build = Callable[[Suspect, JobStatuses], Revocation]


def first_named(
    ask: Callable[[], Revocation | None],
    for_s: float,
    every_s: float,
    wait: Callable[[float], bool],
    clock: Callable[[], float] = time.monotonic,
) -> Revocation | None:
    """``ask()`` until it names a record, every ``every_s`` for at most ``for_s``; None if it
    never does, or once ``wait`` says to stop (it returns True: the end is closing)."""
    deadline = clock() + for_s
    while True:
        found = ask()
        if found is not None:
            return found
        if clock() >= deadline or wait(every_s):
            return None


class Documents(Protocol):
    """What the end needs of the rank's telemetry: who it is, its configuration, and the
    source of the revoke record its statuses and dumps carry."""

    rank: int
    cfg: RuntimeConfig
    revoke_source: Carried | None


class JobRevokeEnd:
    """Rank ``documents.rank``'s end of its job's revoke record through ``key``; the
    rank's statuses and dumps (``documents``) carry the record its followers adopted.
    ``clock`` and ``wait`` pace :meth:`name_hang` (a wait that returns True stops it;
    by default, the end's closing)."""

    def __init__(
        self,
        key: RevokeKey,
        documents: Documents,
        *,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        cfg = documents.cfg
        self.rank = documents.rank
        self.key = key
        #: what the diagnosis of an expired call counts as hung (the watchdog expires a call
        #: after cfg.timeout_s) and as a stale heartbeat
        self.hang_after_s = cfg.timeout_s / 2
        self.stale_after_s = max(cfg.timeout_s, 3 * cfg.status_interval_s)
        #: how long, and how often, the diagnosis is asked again while it names nobody
        self.ask_for_s, self.ask_every_s = 2 * cfg.status_interval_s, cfg.status_interval_s / 2
        #: how long the other ranks wait for a hang's diagnoser before one takes it over:
        #: its asking, and the time one listing and diagnosis of a large job may take
        self.claim_lease_s = self.ask_for_s + 2 * cfg.status_interval_s + 10.0
        #: by when a claimer that names nobody is through: its asking and a last listing
        self.claim_soon_s = self.ask_for_s + 2 * cfg.status_interval_s
        self.last_claim: HangClaim | None = None  # this rank's part in its last hang
        self._followers: list[Handler] = []
        self._carried: list[Carried] = []
        self._last: Revocation | None = None  # the record the listener handed on last
        self._lock = threading.Lock()
        self._handed = threading.Condition(self._lock)  # notified as each record comes
        self._count = 0  # records handed on so far
        self._newest: Revocation | None = None  # the last of them (kept across renewals)
        documents.revoke_source = self.carried
        self._listener = RevokeListener(key, self._hand_on, f"cclctl-revoke-r{self.rank}")
        self._clock = clock
        self._wait = wait or self._listener.stopped.wait

    @property
    def stopped(self) -> threading.Event:
        """Set once the end is closed (a wait on it ends then)."""
        return self._listener.stopped

    # ------------------------------------------------------------------ followers
    def follow(self, handle: Handler, carried: Carried) -> Callable[[], None]:
        """Hand every record the job writes to ``handle`` (the one handed on already, at
        once), and carry ``carried()`` in this rank's documents; returns how to stop
        following. What a front end carried stays carried once it stops: a rank's last
        status and its dumps at exit still say why it failed."""
        with self._lock:
            self._followers.append(handle)
            self._carried.append(carried)
            last = self._last
        if last is not None:
            handle(last)

        def leave() -> None:
            with self._lock:
                if handle in self._followers:
                    self._followers.remove(handle)

        return leave

    def _hand_on(self, record: Revocation) -> None:
        with self._lock:
            self._last = self._newest = record
            self._count += 1
            self._handed.notify_all()
            followers = list(self._followers)
        for handle in followers:
            try:
                handle(record)
            except Exception:  # one front end's failure must not keep it from the others
                log.exception("rank %d: a front end failed on the job's record", self.rank)

    def carried(self) -> Revocation | None:
        """The record this rank's documents carry: the first a follower carries."""
        with self._lock:
            sources = list(self._carried)
        return next((rec for rec in (source() for source in sources) if rec is not None), None)

    def renew(self) -> None:
        """Listen again: the record handed on last no longer holds this rank (a retry or a
        shrink began a new life, a hang record was withdrawn)."""
        with self._lock:
            self._last = None
        self._listener.renew()

    # ------------------------------------------------------------------ the record
    def stored(self) -> Revocation | None:
        """The job's record, if one is there."""
        return self.key.stored()

    def agree(self, record: Revocation) -> Revocation:
        """Write ``record`` as the job's record unless one is there; return the one that is."""
        return self.key.agree(record)

    def withdraw(self, record: Revocation) -> None:
        """Remove the job's record if it is still ``record`` (a hang that ended)."""
        self.key.withdraw(record)

    def name_hang(self, build: Build, hang: str = "") -> Revocation | None:
        """The job's record, or the rank a hang waits on as the live diagnosis of the job's
        statuses names it (``build`` makes its record), agreed with the other ranks; asked
        again for a status interval or two while neither is there (None then). ``hang``
        names the hung call alike on every rank: then only the first rank to claim it
        diagnoses, and the others take its record (:mod:`.hang_claim`)."""

        def ask() -> Revocation | None:
            stored = self.key.stored()
            if stored is not None:
                return stored
            statuses = self.key.statuses()
            found = self._suspect(statuses)
            return None if found is None else self.key.agree(build(found, statuses))

        def diagnose() -> Revocation | None:
            return first_named(ask, self.ask_for_s, self.ask_every_s, self._wait, self._clock)

        seen = self._count  # a record handed on from here on is one a diagnoser wrote
        stored = self.key.stored()
        if stored is not None or not hang:
            return stored or diagnose()

        def handed(timeout_s: float) -> Revocation | None:
            with self._handed:
                self._handed.wait_for(lambda: self._count > seen or self.stopped.is_set(),
                                      timeout_s)  # fmt: skip
                return self._newest if self._count > seen else None

        self.last_claim = HangClaim(
            self.key, self.rank, hang, self.claim_lease_s, self.claim_soon_s
        )
        return self.last_claim.run(diagnose, self.key.stored, handed)

    def _suspect(self, statuses: JobStatuses) -> Suspect | None:
        from cclctl.diagnose_io.hang_origin import hang_suspect  # only when a hang expires

        return hang_suspect(statuses, self.hang_after_s, self.stale_after_s)

    def close(self) -> None:
        """Stop listening and close the store connections; the store may already be gone
        (a hang's waiter, if any, stops waiting)."""
        self._listener.close()
        with self._handed:
            self._handed.notify_all()


def open_end(
    make: Callable[[Callable[[], JobRevokeEnd]], object],
    address: str,
    token: str,
    job: str,
    telemetry: Documents,
) -> JobRevokeEnd:
    """The agent's revoke end (``make`` is :meth:`Agent.revoke_end`): the one a front end
    of this rank opened already, else a new one, listening through the host agent's
    fan-out where the job has agents (``CCLCTL_HOST_AGENT``)."""

    def new() -> JobRevokeEnd:
        cfg = telemetry.cfg
        feed = None
        if cfg.host_agent:
            feed = RevokeFeed(fanout_name(socket_name(job, cfg.hostname, address, token)))
        return JobRevokeEnd(RevokeKey(address, token, job, telemetry.rank, feed), telemetry)

    end = make(new)
    assert isinstance(end, JobRevokeEnd), end
    return end
