"""How a failed call failed, for the diagnosis: whom it waited on, which link broke, and what
a mismatched peer called.

A record's ``fault`` (:class:`cclctl.call_fault.CallFault`) holds these facts as fields; a
record without one (an older document, a Flight Recorder dump) falls back to the words of
its error (:mod:`cclctl.diagnose.errtext_fallback`). Each function reads one fact.
"""

from __future__ import annotations

from cclctl import call_fault
from cclctl.diagnose import errtext_fallback
from cclctl.diagnose.errtext_fallback import Edge
from cclctl.records import CollectiveRecord

__all__ = ["Edge", "broken_link", "mismatch_claim", "revoked", "waited_on"]

#: Kinds whose peer is the call's own link, broken under it (not a peer that failed).
_BROKEN = frozenset({call_fault.LINK_BROKE, call_fault.LINK_DROPPED})
#: Kinds that name the peer the call waited on, with the direction where they know it.
_WAITED = frozenset(
    {call_fault.TIMEOUT, call_fault.LINK_BROKE, call_fault.LINK_DROPPED, call_fault.PEER_FAILED}
)


def waited_on(rec: CollectiveRecord) -> Edge | None:
    """The peer a failed call was waiting for: the origin of the failure that revoked it,
    or the peer its own link names."""
    fault = rec.fault
    if fault is None:
        return errtext_fallback.waited_on(rec.error)
    if fault.kind == call_fault.REVOKED and fault.origin is not None:
        return fault.origin, ""
    if fault.kind in _WAITED and fault.peer is not None:
        return fault.peer, fault.direction
    return None


def revoked(rec: CollectiveRecord) -> bool:
    """The call was revoked: it names the job failure's origin, not a peer it talked to."""
    fault = rec.fault
    if fault is None:
        return errtext_fallback.revoked(rec.error)
    return fault.kind == call_fault.REVOKED


def broken_link(rec: CollectiveRecord) -> int | None:
    """The peer at the far end of a link this call saw break (not a peer that failed)."""
    fault = rec.fault
    if fault is None:
        return errtext_fallback.broken_link(rec.error)
    return fault.peer if fault.kind in _BROKEN else None


def mismatch_claim(rec: CollectiveRecord, seq: int) -> tuple[int, str] | None:
    """(peer, what the peer called, in the runtime's words) from a mismatch at ``seq``."""
    fault = rec.fault
    if fault is None:
        return errtext_fallback.mismatch_claim(rec.error, seq)
    if fault.kind != call_fault.MISMATCH or fault.peer is None or not fault.theirs:
        return None
    if not rec.seq == fault.their_seq == seq:
        return None  # a peer at another seq is a different story (a skipped call)
    return fault.peer, fault.theirs
