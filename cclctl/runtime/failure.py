"""One communicator's failure state: whether its calls may run, and why not.

Every way a communicator stops working goes through one :class:`FailureState`: a call that
failed (its links may hold half a message), an abort (an operator, the watchdog's ``abort``
policy), a hang the watchdog expired under the ``raise`` policy, and ``close()``. The first
failure wins and keeps its :class:`Origin`; later ones are only counted. Every call checks
``status`` when it opens and every blocked wait checks it on each turn (one attribute read
while all is well), so nothing runs on a communicator that has failed, whatever its size.

A failure of a link also reaches this rank's peers on the same host: the state calls its
``announce`` hook (the transport's; shared memory sets this rank's state word, which peers'
waits read), so theirs ends at once instead of at their timeout.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import NoReturn

from cclctl.errors import (
    CollectiveTimeout,
    CommAborted,
    CommError,
    PeerError,
    ProtocolError,
)
from cclctl.records import CollectiveRecord

#: ``FailureState.status`` values (always one of these objects: compare with ``is``).
OK, BROKEN, ABORTED, CLOSED = "ok", "broken", "aborted", "closed"

#: Kinds of failure that break a link: they are announced to the peers on this host.
LINK_KINDS = frozenset({"peer", "mismatch"})


@dataclasses.dataclass(frozen=True, slots=True)
class Origin:
    """Where a failure started: its ``kind`` (``aborted``, ``timeout``, ``peer``,
    ``mismatch``, ``error``), why, the ``rank`` it started at (the peer, for a link that
    broke), the call it hit (``seq``, ``op``; None when no call was in flight) and who saw it
    (``call``: the call's own error; ``abort``: an explicit abort; ``watchdog``)."""

    kind: str
    reason: str
    rank: int
    seq: int | None = None
    op: str | None = None
    seen_by: str = "call"

    def describe(self) -> str:
        """``all_reduce seq 3: <reason>``, or the reason alone outside any call."""
        return self.reason if self.op is None else f"{self.op} seq {self.seq}: {self.reason}"


def kind_of(exc: BaseException) -> str:
    """The failure kind a call's exception stands for."""
    if isinstance(exc, CollectiveTimeout):
        return "timeout"
    if isinstance(exc, CommAborted):
        return "aborted"
    if isinstance(exc, PeerError):
        return "peer"
    if isinstance(exc, ProtocolError):
        return "mismatch"
    return "error"


def timeout_error(rank: int, op: str, seq: int, peer: int, what: str, elapsed: float) -> NoReturn:
    """Raise the :class:`CollectiveTimeout` of a call that waited ``elapsed`` seconds on
    ``peer`` (``what``: ``send`` or ``recv``)."""
    raise CollectiveTimeout(
        f"rank {rank}: {op} seq {seq} timed out after {elapsed:.1f}s "
        f"waiting to {what} {'to' if what == 'send' else 'from'} rank {peer}",
        rank=rank,
        peer=peer,
        seq=seq,
        op=op,
        elapsed=round(elapsed, 3),
        waiting_for=what,
    )


class FailureState:
    """The failure state of communicator ``comm`` at ``rank``.

    ``status`` is :data:`OK` until the first failure; ``first`` is that failure's origin and
    ``later`` counts the failures after it. ``epoch`` numbers the communicator's lives: calls
    carry it on the wire and in their records.
    """

    __slots__ = ("_announce", "_lock", "comm", "epoch", "first", "later", "rank", "status")

    def __init__(
        self, rank: int = -1, comm: str = "", announce: Callable[[str], None] | None = None
    ) -> None:
        """``announce(status)``: tells this rank's local peers it is ``broken`` or ``closed``."""
        self.rank = rank
        self.comm = comm
        self.epoch = 0
        self.status = OK
        self.first: Origin | None = None
        self.later = 0
        self._announce = announce
        self._lock = threading.Lock()  # the watchdog and an operator fail from other threads

    # ------------------------------------------------------------------ setting it
    def fail(self, origin: Origin, status: str = BROKEN) -> bool:
        """Record a failure; True if it is the first (it sets ``status`` and ``first``),
        False if one came before (it is counted in ``later``). A link failure is announced
        to local peers either way, as its link is unusable either way."""
        with self._lock:
            first = self.first is None
            if first:
                self.first = origin  # before status: a reader that sees the status sees why
                self.status = status
            else:
                self.later += 1
        if origin.kind in LINK_KINDS:
            self._tell(BROKEN)
        return first

    def abort(
        self, reason: str, *, seen_by: str = "abort", seq: int | None = None, op: str | None = None
    ) -> bool:
        """Abort: every blocked or future call fails with ``reason`` (:class:`CommAborted`)."""
        return self.fail(Origin("aborted", reason, self.rank, seq, op, seen_by), ABORTED)

    def call_failed(self, exc: BaseException, rec: CollectiveRecord) -> bool:
        """A call ended with ``exc`` (``rec`` is its closed record): no later call can trust
        the links, which may hold half a message."""
        peer = exc.fields.get("peer") if isinstance(exc, PeerError) else None
        rank = peer if isinstance(peer, int) else self.rank
        reason = rec.error or type(exc).__name__
        return self.fail(Origin(kind_of(exc), reason, rank, rec.seq, rec.op))

    def hung(self, rec: CollectiveRecord, line: str, policy: str) -> bool:
        """The watchdog expired ``rec`` (``line`` says whom it waits on); ``policy`` is
        ``CCLCTL_ON_HANG``: ``raise`` (the call raises :class:`CollectiveTimeout`),
        ``abort`` (:class:`CommAborted`) or ``wait`` (nothing). True if it failed the state."""
        if policy == "wait" or rec.end_ns or rec.comm != self.comm:
            return False  # the call ended meanwhile, or it is another communicator's
        if policy == "abort":
            return self.abort(f"watchdog: {line}", seen_by="watchdog", seq=rec.seq, op=rec.op)
        return self.fail(Origin("timeout", line, self.rank, rec.seq, rec.op, "watchdog"))

    def close(self) -> bool:
        """Close: every later call is refused. False if it was closed already. A failure
        before it stays ``first``; peers on this host learn of the close."""
        with self._lock:
            if self.status is CLOSED:
                return False
            self.status = CLOSED
        self._tell(CLOSED)
        return True

    def bump_epoch(self) -> int:
        """Start the communicator's next life and return its epoch: the seam recovery uses
        once every rank has agreed and the links are renewed (nothing calls it yet). The
        failure is forgotten; calls after it carry the new epoch."""
        with self._lock:
            if self.status is CLOSED:
                raise CommError(f"rank {self.rank}: communicator {self.comm} is closed")
            self.epoch += 1
            self.first = None
            self.later = 0
            self.status = OK
            return self.epoch

    def _tell(self, status: str) -> None:
        if self._announce is not None:
            self._announce(status)

    # ------------------------------------------------------------------ reading it
    def refuse(self, op: str) -> NoReturn:
        """Raise for ``op``, a call opening on this failed or closed communicator."""
        rank, first = self.rank, self.first
        if self.status is CLOSED or first is None:
            raise CommError(f"rank {rank}: {op} on a closed communicator", op=op)
        if self.status is ABORTED:
            raise CommAborted(
                f"rank {rank}: {op} on communicator {self.comm} aborted ({first.reason})",
                rank=rank,
                comm=self.comm,
                op=op,
                reason=first.reason,
            )
        raise CommAborted(
            f"rank {rank}: communicator {self.comm} is unusable after an earlier failure "
            f"({first.describe()}); create a new one",
            rank=rank,
            comm=self.comm,
            op=op,
        )

    def stop(self, op: str, seq: int, peer: int, what: str, elapsed: float) -> NoReturn:
        """Raise for call ``op`` ``seq``, blocked ``elapsed`` seconds on ``peer`` when the
        state failed: an abort, the watchdog's timeout, a close or another failure."""
        rank, first = self.rank, self.first
        if self.status is CLOSED or first is None:
            raise CommError(
                f"rank {rank}: {op} seq {seq}: communicator {self.comm} closed while it waited",
                rank=rank,
                peer=peer,
                seq=seq,
                op=op,
            )
        if first.kind == "timeout":
            timeout_error(rank, op, seq, peer, what, elapsed)
        why = first.reason if self.status is ABORTED else f"after {first.describe()}"
        raise CommAborted(
            f"rank {rank}: {op} seq {seq} aborted ({why})",
            rank=rank,
            peer=peer,
            seq=seq,
            op=op,
            reason=why,
        )

    def __repr__(self) -> str:
        why = "" if self.first is None else f" first={self.first.describe()!r} later={self.later}"
        return f"<FailureState {self.comm} rank {self.rank} epoch {self.epoch} {self.status}{why}>"
