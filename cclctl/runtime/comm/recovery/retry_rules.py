"""What a retry's ranks agree on (``CCLCTL_RETRY_BUDGET``): what each brings, the plan they
make, which calls and failures a retry covers, and the job's side of it (:class:`Retrier`).

The policy that runs a call through a retry is :mod:`~.retrying`; the agreement in the
job's store is :mod:`cclctl.runtime.job.retry`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

from cclctl.errors import CommError

if TYPE_CHECKING:
    from cclctl.runtime.comm.recovery.port import Port

#: The transports whose links a retry renews (shared memory alone has none to break).
RETRIED_TRANSPORTS = ("tcp", "hybrid")
#: The calls whose result every rank holds alike: a rank one call behind takes it from a
#: rank ahead.
SHARED = ("all_reduce", "all_gather", "broadcast", "barrier")
#: The calls a retry runs again: those, and the ones whose result differs by rank, which
#: the ranks ahead of a rank one call behind run again with it.
RERUNS = (*SHARED, "reduce_scatter", "reduce", "all_to_all", "all_to_allv")
#: Revocation kinds a retry recovers from: a link broke or stalled between live ranks, or
#: an operator asked for a retry (``cclctl retry``).
RETRIED_KINDS = ("link", "retry")
#: How long a closing rank waits on the store between looks at its failure state.
AGREE_WAIT_S = 0.25


@dataclasses.dataclass(frozen=True)
class Ask:
    """What a rank brings to a retry: the call it was in, the collective seq it has not
    completed (``pending``), the seqs of the calls it kept (:class:`~.rerun.Kept`: from
    ``kept_from`` to ``kept``, their ops in ``kept_ops``), its attempt number and the
    budget's deadline (``time.monotonic()``); ``done``: ``pending`` where its call's result
    is whole here (it failed in the call's confirm), else 0."""

    call: str
    pending: int
    kept: int
    attempt: int
    deadline: float
    kept_from: int = 0
    kept_ops: str = ""
    done: int = 0


#: A catch-up seq whose result differs by rank: the ranks ahead run it again from its
#: kept input, with the ranks behind.
REPLAY = -1
#: A catch-up seq that ended with a confirm (:class:`~.rerun.Ending`): the ranks behind,
#: still inside it, hold their whole result and return it; nothing moves.
HELD = -2
#: The ``algo`` of the record that closes a :data:`HELD` seq on every rank (nothing runs).
HELD_ALGO = "held"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What every rank agreed: the calls open again from seq ``seq``. Each seq from there
    below :attr:`rerun` is one the ranks ahead completed and the ranks behind did not:
    ``roots[i]`` is the rank whose kept result of seq ``seq + i`` the ranks behind take (a
    broadcast), or :data:`REPLAY`: the ranks ahead run it again from its kept input, with
    the ranks behind, or :data:`HELD`: the ranks behind return what they hold. Then every
    rank re-runs seq :attr:`rerun` (a rank closing there has no call to re-run, and goes
    on closing)."""

    seq: int
    roots: tuple[int, ...] = ()

    @property
    def rerun(self) -> int:
        return self.seq + len(self.roots)

    def step(self, seq: int) -> int | None:
        """How seq ``seq`` catches up (a root, or :data:`REPLAY`); None: it is no catch-up."""
        i = seq - self.seq
        return self.roots[i] if 0 <= i < len(self.roots) else None


class Retrier(Protocol):
    """The job's side of a retry (:class:`cclctl.runtime.job.retry.Retry`)."""

    def __call__(self, comm: Port, ask: Ask) -> Plan:
        """Agree with every rank and renew the transport; raises :class:`CommError` when
        that cannot be done within the deadline."""

    def refuse(self, comm: Port, ask: Ask) -> None:
        """Tell the agreement, without waiting, that this rank's call is not re-run."""

    def all_closed(self, comm: Port, ask: Ask, wait_s: float) -> bool:
        """Say this rank is closing (after ``ask.pending - 1``) and wait up to ``wait_s``
        for every rank to say so; True once all have."""

    def leave(self, comm: Port, ask: Ask) -> None:
        """Say this rank closed for good: a retry that needs it fails at once, naming it."""


def enabled(comm: Port) -> bool:
    """Retry is on for ``comm``: a budget, and TCP links under it."""
    return comm.cfg.retry_budget_s > 0 and comm.transport.name in RETRIED_TRANSPORTS


def why_not(comm: Port) -> str:
    """Why ``comm`` cannot retry, in words (empty when it can)."""
    if comm.cfg.retry_budget_s <= 0:
        return "CCLCTL_RETRY_BUDGET=0 turns retry off"
    if comm.transport.name not in RETRIED_TRANSPORTS:
        return f"its {comm.transport.name} transport has no TCP links to renew"
    return ""


def retryable(exc: CommError) -> bool:
    """A failure a retry recovers from: a link broke or stalled (the revoke record says so)."""
    rev = exc.revocation
    return rev is not None and rev.kind in RETRIED_KINDS
