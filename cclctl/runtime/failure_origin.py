"""What a rank saw when a call failed, made into the failure's origin: whose failure it was.

A rank sees one side: a broken link, a peer's header that differs, a wait that outlived its
deadline. A link to a peer on this host whose process is gone (or goes within
:data:`PEER_EXIT_GRACE_S`: a dying process closes its sockets before it turns zombie) is
that peer's death, with its signal where the zombie still shows it; a mismatch names the
peer and both calls; a hang names the peer the call waits on (stopped, where ``/proc``
says so). Origins are the job's ranks: a transport's error names the communicator's, which
are turned into the job's here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from cclctl.errors import CclError, CollectiveTimeout, CommAborted, PeerError, ProtocolError
from cclctl.records import CollectiveRecord
from cclctl.revocation import Revocation
from cclctl.runtime.peer_process import (
    GONE,
    PEER_EXIT_GRACE_S,
    gone_within,
    process_state,
)


class Seer(Protocol):
    """What this module reads of the failure state (:class:`cclctl.runtime.failure.
    FailureState`): the rank, its host, every job rank's (host, pid), and its records."""

    rank: int
    host: str
    peers: Sequence[tuple[str, int]]

    def job_rank(self, rank: int) -> int: ...

    def record(self, kind: str, reason: str, origin: int, **fields: Any) -> Revocation: ...


def witnessed(state: Seer, exc: BaseException, rec: CollectiveRecord, call: str) -> Revocation:
    """What this rank saw when its call failed with ``exc``: whose failure it was."""
    at = {"seq": rec.seq, "op": rec.op, "call": call}
    fields = exc.fields if isinstance(exc, CclError) else {}
    peer = fields.get("peer")
    if isinstance(exc, (ProtocolError, PeerError)) and isinstance(peer, int):
        peer = state.job_rank(peer)  # a transport's error numbers the communicator's ranks
    if isinstance(exc, ProtocolError) and isinstance(peer, int) and "theirs" in fields:
        why = f"called {fields['theirs']} where rank {state.rank} called {fields['mine']}"
        hint = str(fields.get("hint", ""))
        theirs, mine = str(fields["theirs"]), f"{fields['mine']}{hint}"
        return state.record(
            "mismatch", why + hint, peer, peer=state.rank, called=theirs, peer_called=mine, **at
        )
    if isinstance(exc, PeerError) and isinstance(peer, int):
        return _peer_failed(state, peer, str(fields.get("why") or exc), at)
    if isinstance(exc, CollectiveTimeout) and isinstance(peer, int):
        return state.record(
            "hang",
            f"did not answer for {fields.get('elapsed', 0)}s",
            peer,
            via="call",
            symptom="stuck",
            **at,
        )
    if isinstance(exc, CommAborted):
        return state.record("aborted", str(exc), state.rank, **at)
    return state.record("error", f"{type(exc).__name__}: {exc}", state.rank, **at)


def _peer_failed(state: Seer, peer: int, why: str, at: dict[str, Any]) -> Revocation:
    """A link to job rank ``peer`` broke: it died (its process is gone from this host), or
    the link broke under two live ranks (as far as this rank can tell)."""
    local = 0 <= peer < len(state.peers) and state.peers[peer][0] == state.host and state.host
    gone = gone_within(state.peers[peer][1], PEER_EXIT_GRACE_S) if local else None
    if gone is None and why == GONE:
        gone = GONE
    if gone is not None:
        return state.record("died", gone, peer, via="pidfd" if local else "link", **at)
    low, high = sorted((peer, state.rank))
    return state.record("link", why, low, peer=high, via="link", **at)


def hang(state: Seer, rec: CollectiveRecord) -> Revocation:
    """A hang as this rank alone sees it: the peer its call waits on (``waiting_on``, a job
    rank) is the origin."""
    peer = rec.waiting_on if rec.waiting_on is not None else state.rank
    pid = state.peers[peer][1] if 0 <= peer < len(state.peers) else 0
    local = 0 <= peer < len(state.peers) and state.peers[peer][0] == state.host
    took = (time.time_ns() - rec.start_ns) / 1e9 if rec.start_ns else 0.0
    stopped = bool(local) and process_state(pid) == "T"
    reason = "is stopped (process state T)" if stopped else f"has not answered for {took:.1f}s"
    symptom = "stopped" if stopped else "stuck"
    at = {"seq": rec.seq, "op": rec.op, "call": rec.op}
    return state.record("hang", reason, peer, via="watchdog", symptom=symptom, **at)
