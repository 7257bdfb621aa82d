"""One communicator's failure state: whether its calls may run, and which failure stopped them.

Every way a communicator stops working goes through one :class:`FailureState`: a call that
failed (its links may hold half a message), another rank's failure arriving (from a local
peer's shared memory, a link or the job's store), an abort (an operator, the watchdog's
``abort`` policy), a hang the watchdog expired, and ``close()``. The first failure wins and
is kept as a :class:`~cclctl.revocation.Revocation` naming its origin; later ones are only
counted, so every rank's error names the origin, never a neighbour that failed after it.
Every call checks ``status`` when it opens and every blocked wait checks it on each turn.

The first failure spreads at once: the transport's ``announce`` hook tells the peers it
can reach, and the ``on_first`` listeners (the job's store) tell the rest. What a rank saw
is made into the origin in :mod:`~cclctl.runtime.failure_origin`; the errors calls raise
are in :mod:`~cclctl.runtime.failure_errors`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from cclctl.errors import CclError, CommError
from cclctl.records import CollectiveRecord
from cclctl.revocation import Revocation
from cclctl.runtime import failure_errors, failure_origin
from cclctl.runtime.identity import UNKNOWN, RankIdentity

#: ``FailureState.status`` values (always one of these objects: compare with ``is``).
OK, BROKEN, ABORTED, CLOSED = "ok", "broken", "aborted", "closed"

#: How a failure reached this rank, as ``on_first`` listeners are told: this rank saw it,
#: a peer told it (shared memory, a link), or the job's store did.
SELF, PEER, STORE = "self", "peer", "store"

#: How long a call that failed while another thread spreads the first failure (the store's
#: listener, the watchdog) waits for it, so its process cannot exit before: a few store
#: requests, each bounded.
SPREAD_WAIT_S = 5.0

Announce = Callable[[str, Revocation | None], None]
Listener = Callable[[Revocation, str], None]
Resolver = Callable[[Revocation], Revocation]


class FailureState:
    """The failure state of communicator ``comm`` at ``rank``, this process's rank in the job.

    ``status`` is :data:`OK` until the first failure; ``first`` is that failure's record and
    ``later`` counts the failures after it. ``epoch`` numbers the communicator's lives: calls
    carry it on the wire and in their records. ``peers`` holds every job rank's (host, pid)
    once the job is joined, so a record names its origin's process.

    Records, errors and the live record's ``waiting_on`` name the job's ranks, whatever the
    communicator: ``members`` maps the ranks its transport numbers (a shrunk communicator's
    0..n-1) to the job's, and :meth:`job_rank` applies it where a transport's rank comes in.
    """

    __slots__ = (
        "_announce",
        "_listeners",
        "_lock",
        "_renewed",
        "_spread",
        "_wake",
        "comm",
        "epoch",
        "evidence",
        "first",
        "host",
        "later",
        "members",
        "peers",
        "rank",
        "resolve",
        "status",
    )

    def __init__(
        self,
        rank: int = -1,
        comm: str = "",
        announce: Announce | None = None,
        members: Sequence[int] = (),
        identity: RankIdentity = UNKNOWN,
    ) -> None:
        """``announce(status, record)``: tells this rank's peers it is ``broken`` (why:
        ``record``) or ``closed``, by the transport's own means. ``members``: the job's rank
        of each of the communicator's ranks (empty: they are the same); ``identity``: this
        rank's host and evidence, every job rank's process."""
        self.rank = rank
        self.comm = comm
        self.members = tuple(members)
        self.epoch = 0
        self.status = OK
        self.first: Revocation | None = None
        self.later = 0
        self.host = identity.host
        #: where this rank's dump goes when it fails (its error says so); empty: nowhere
        self.evidence = identity.evidence
        self.peers: Sequence[tuple[str, int]] = identity.peers
        #: agrees a one-sided record (a broken link, a mismatch) with the other ranks
        #: before it is final (the job's store); None: the record stands as seen
        self.resolve: Resolver | None = None
        self._announce = announce
        self._listeners: list[Listener] = []
        self._renewed: list[Callable[[int], None]] = []
        self._spread = threading.Event()  # set once the first failure has spread
        self._wake: int | None = None
        self._lock = threading.Lock()  # the watchdog, the store and an operator fail it too

    # ------------------------------------------------------------------ setting it
    def on_first(self, listener: Listener) -> None:
        """Call ``listener(record, how)`` once, at the first failure (``how``: :data:`SELF`,
        :data:`PEER` or :data:`STORE`)."""
        self._listeners.append(listener)

    def on_renew(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(epoch)`` each time a retry starts a new epoch (:meth:`bump_epoch`)."""
        self._renewed.append(listener)

    def fail(self, rev: Revocation, status: str = BROKEN, how: str = SELF) -> bool:
        """Record a failure; True if it is the first (it sets ``first``, spreads, then sets
        ``status``), False if one came before (it is counted in ``later``).

        ``status`` changes last: a blocked call that sees it raises at once, and its
        process may exit right after, so the peers, the store (the listeners) and this
        rank's status must have heard of the failure by then."""
        with self._lock:
            if self.first is not None or self.status is CLOSED:
                self.later += 1
                return False
            self.first = rev
        if self._announce is not None:
            with contextlib.suppress(Exception):  # telling peers must never hide the failure
                self._announce(BROKEN, rev)
        for listener in list(self._listeners):
            with contextlib.suppress(Exception):
                listener(rev, how)
        with self._lock:
            if self.status is OK:  # not closed meanwhile
                self.status = status
        self._spread.set()
        self._poke()
        return True

    def adopt(self, rev: Revocation, how: str = PEER) -> bool:
        """Another rank's failure reached this one: fail with its record, as it is."""
        return self.fail(rev, ABORTED if rev.kind == "aborted" else BROKEN, how)

    def abort(
        self, reason: str, *, via: str = "abort", seq: int | None = None, op: str | None = None
    ) -> bool:
        """Abort: every blocked or future call fails with ``reason`` (:class:`CommAborted`)."""
        return self.fail(
            self.record("aborted", reason, self.rank, seq=seq, op=op, via=via), ABORTED
        )

    def call_failed(
        self, exc: BaseException, rec: CollectiveRecord, call: str = ""
    ) -> Revocation | None:
        """A call ended with ``exc`` (``rec`` is its record, ``call`` the call in words): no
        later call can trust the links, which may hold half a message. Returns the state's
        first failure."""
        rev = getattr(exc, "revocation", None)
        if not isinstance(rev, Revocation):
            rev = self.witnessed(exc, rec, call or rec.op)
            if self.resolve is not None and self.first is None:
                with contextlib.suppress(Exception):
                    rev = self.resolve(rev)
        how = SELF if rev.seen_by == self.rank else PEER
        if self.fail(rev, ABORTED if rev.kind == "aborted" else BROKEN, how):
            if isinstance(exc, CclError) and exc.revocation is None:
                exc.revocation = rev  # this error is the origin's own account
        else:  # another thread may be spreading the first failure: the call raises after it
            if self.first is not None:
                self._spread.wait(SPREAD_WAIT_S)
            self._tell_again()
        return self.first

    def _tell_again(self) -> None:
        """The failure came from another thread (the watchdog, the store): tell the peers
        again from the thread whose call it ended, which may write to the links."""
        if self._announce is not None and self.first is not None:
            with contextlib.suppress(Exception):
                self._announce(BROKEN, self.first)

    def hung(
        self, rec: CollectiveRecord, line: str, policy: str, origin: Revocation | None = None
    ) -> bool:
        """The watchdog expired ``rec`` (``line`` says whom it waits on; ``origin``: the
        rank the hang waits on, as the job agreed it, else :meth:`hang_record`); ``policy``
        is ``CCLCTL_ON_HANG``: ``raise`` (the call raises :class:`CollectiveTimeout`),
        ``abort`` (:class:`CommAborted`) or ``wait`` (nothing). True if it failed the state."""
        if policy == "wait" or rec.end_ns or rec.comm != self.comm:
            return False  # the call ended meanwhile, or it is another communicator's
        if policy == "abort":
            return self.abort(f"watchdog: {line}", via="watchdog", seq=rec.seq, op=rec.op)
        return self.fail(origin or self.hang_record(rec))

    def hang_record(self, rec: CollectiveRecord) -> Revocation:
        """A hang as this rank alone sees it (:func:`failure_origin.hang`)."""
        return failure_origin.hang(self, rec)

    def close(self) -> bool:
        """Close: every later call is refused. False if it was closed already. A failure
        before it stays ``first``; peers on this host learn of the close."""
        with self._lock:
            if self.status is CLOSED:
                return False
            self.status = CLOSED
        self._poke()
        if self._announce is not None:
            self._announce(CLOSED, None)
        return True

    def bump_epoch(self, announce: Announce | None = None) -> int:
        """Start the communicator's next life and return its epoch: what a retry does once
        every rank has agreed and the links are renewed (``announce``: the new transport's
        hook). The failure is forgotten; calls after it carry the new epoch."""
        with self._lock:
            if self.status is CLOSED:
                raise CommError(f"rank {self.rank}: communicator {self.comm} is closed")
            if announce is not None:
                self._announce = announce
            self.epoch += 1
            self.first = None
            self.later = 0
            self.status = OK
            self._spread.clear()
            if self._wake is not None:  # readable since the failure: a wait would spin
                with contextlib.suppress(OSError):
                    os.eventfd_read(self._wake)
            epoch = self.epoch
        for listener in list(self._renewed):
            with contextlib.suppress(Exception):
                listener(epoch)
        return epoch

    @property
    def closed(self) -> bool:
        return self.status is CLOSED

    # ------------------------------------------------------------------ records
    def job_rank(self, rank: int) -> int:
        """The job's rank of the communicator's ``rank`` (as its transport numbers it)."""
        members = self.members
        return members[rank] if members and 0 <= rank < len(members) else rank

    def record(self, kind: str, reason: str, origin: int, **fields: Any) -> Revocation:
        """A record of a failure seen here (``origin`` and a ``peer`` field are job ranks),
        its origin's host and pid filled in."""
        host, pid = self.peers[origin] if 0 <= origin < len(self.peers) else ("", 0)
        return Revocation(
            kind, origin, reason, host=host, pid=pid, comm=self.comm, epoch=self.epoch,
            seen_by=self.rank, **fields,
        )  # fmt: skip

    def witnessed(self, exc: BaseException, rec: CollectiveRecord, call: str) -> Revocation:
        """Whose failure ``exc`` is (:func:`failure_origin.witnessed`)."""
        return failure_origin.witnessed(self, exc, rec, call)

    # ------------------------------------------------------------------ waking waits
    @property
    def wake_fd(self) -> int:
        """A descriptor that turns readable at the first failure or the close, so a wait
        that blocks in ``poll`` ends at once (created on first use)."""
        if self._wake is None:
            with self._lock:
                if self._wake is None:
                    self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                    if self.status is not OK:
                        os.eventfd_write(self._wake, 1)
        return self._wake

    def _poke(self) -> None:
        if self._wake is not None:
            with contextlib.suppress(OSError):
                os.eventfd_write(self._wake, 1)

    # ------------------------------------------------------------------ reading it
    def refuse(self, op: str) -> NoReturn:
        """Raise for ``op``, opening on this failed or closed communicator."""
        raise failure_errors.refusal(self, op)

    def stop(self, call: str, op: str, seq: int, peer: int, what: str, elapsed: float) -> NoReturn:
        """Raise for call ``op`` ``seq`` (``call``: in words), blocked ``elapsed`` seconds on
        job rank ``peer`` when the state failed (:func:`failure_errors.stopped`)."""
        raise failure_errors.stopped(self, call, op, seq, peer, what, elapsed)

    def error(self, first: Revocation, where: str, **fields: Any) -> CommError:
        """The exception a call raises for failure ``first`` (:func:`failure_errors.error_for`)."""
        return failure_errors.error_for(self, first, where, **fields)

    def __repr__(self) -> str:
        why = "" if self.first is None else f" first={self.first.describe()!r} later={self.later}"
        return f"<FailureState {self.comm} rank {self.rank} epoch {self.epoch} {self.status}{why}>"
