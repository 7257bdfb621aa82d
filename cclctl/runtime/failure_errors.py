"""The errors a call raises for its communicator's failure: each names the failure's origin.

The rank that saw the failure raises its own kind (``PeerError`` for a death or a broken
link, ``ProtocolError`` for a mismatch, ``CollectiveTimeout`` for a hang its watchdog
expired); every other rank ``CommRevoked``; an abort ``CollectiveAborted``. The record is
the error's ``revocation``.
"""

from __future__ import annotations

from typing import Any, NoReturn, Protocol

from cclctl import call_fault
from cclctl.errors import (
    CollectiveAborted,
    CollectiveTimeout,
    CommAborted,
    CommError,
    CommRevoked,
    PeerError,
    ProtocolError,
)
from cclctl.revocation import Revocation


class Failed(Protocol):
    """What the errors read of the failure state (:class:`cclctl.runtime.failure.
    FailureState`): the rank, the communicator, its first failure and whether it closed."""

    rank: int
    comm: str
    first: Revocation | None

    @property
    def closed(self) -> bool: ...


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
        fault=call_fault.TIMEOUT,
    )


def revoked(where: str, rev: Revocation, **fields: Any) -> CommAborted:
    """The error of a call that another rank's failure ``rev`` ended (``where``: ``rank 4:
    all_reduce(float32, sum, count 8) seq 5``): :class:`CommRevoked`, or
    :class:`CollectiveAborted` for an abort."""
    fields.update(origin=rev.origin, kind=rev.kind, fault=call_fault.REVOKED)
    exc: CommAborted
    if rev.kind == "aborted":
        fields.update(reason=rev.reason, fault=call_fault.ABORTED)
        exc = CollectiveAborted(f"{where} {rev.describe()}", **fields)
    else:
        exc = CommRevoked(f"{where} revoked: {rev.describe()}", **fields)
    exc.revocation = rev
    return exc


def refusal(state: Failed, op: str) -> CommError:
    """Raise for ``op``, a call opening on this failed or closed communicator."""
    rank, first = state.rank, state.first
    if state.closed or first is None:
        return CommError(f"rank {rank}: {op} on a closed communicator", op=op)
    where = f"rank {rank}: {op} on communicator {state.comm}"
    if first.kind == "aborted":
        exc: CommError = CollectiveAborted(
            f"{where} refused: {first.describe()}",
            rank=rank,
            comm=state.comm,
            op=op,
            reason=first.reason,
            fault=call_fault.ABORTED,
        )
    else:
        at = f" in {first.at()}" if first.op else ""
        exc = CommRevoked(
            f"{where} refused: the communicator was revoked{at}: {first.describe()}; "
            "create a new one",
            rank=rank,
            comm=state.comm,
            op=op,
            origin=first.origin,
            fault=call_fault.REVOKED,
        )
    exc.revocation = first
    return exc


def stopped(
    state: Failed, call: str, op: str, seq: int, peer: int, what: str, elapsed: float
) -> CommError:
    """Raise for call ``op`` ``seq`` (``call``: in words), blocked ``elapsed`` seconds on
    ``peer`` when the state failed: a timeout, an abort, another rank's failure, a close."""
    rank, first = state.rank, state.first
    if state.closed or first is None:
        return CommError(
            f"rank {rank}: {op} seq {seq}: communicator {state.comm} closed while it waited",
            rank=rank,
            peer=peer,
            seq=seq,
            op=op,
        )
    return error_for(
        state,
        first,
        f"rank {rank}: {call} seq {seq}",
        op=op,
        seq=seq,
        peer=peer,
        elapsed=elapsed,
        what=what,
    )


def error_for(state: Failed, first: Revocation, where: str, **fields: Any) -> CommError:
    """The exception a call raises for failure ``first`` (``where``: ``rank 4:
    all_reduce(...) seq 5``): its own kind where this rank saw it, else revoked."""
    own = first.seen_by == state.rank
    kw = {k: v for k, v in fields.items() if k not in ("elapsed", "what")}
    kw.update(rank=state.rank, origin=first.origin, kind=first.kind, fault=call_fault.FAILED)
    exc: CommError
    if first.kind == "aborted":
        return revoked(where, first, **kw)
    if first.kind == "hang" and own:
        elapsed = fields.get("elapsed")
        took = f" after {elapsed:.1f}s" if isinstance(elapsed, float) else ""
        what, peer = fields.get("what"), fields.get("peer")
        if what in ("send", "recv") and isinstance(peer, int):
            took += f" waiting to {what} {'to' if what == 'send' else 'from'} rank {peer}"
        kw["fault"] = call_fault.TIMEOUT  # its peer and direction, where ``took`` names them
        exc = CollectiveTimeout(
            f"{where} timed out{took}: {first.describe()}", waiting_for=fields.get("what"), **kw
        )
    elif own and first.kind in ("died", "link"):
        exc = PeerError(f"{where} failed: {first.describe()}", **kw)
    elif own and first.kind == "mismatch":
        exc = ProtocolError(f"{where} failed: {first.describe()}", **kw)
    elif own:
        exc = CommAborted(f"{where} failed: {first.describe()}", **kw)
    else:
        return revoked(where, first, **kw)
    exc.revocation = first
    return exc
