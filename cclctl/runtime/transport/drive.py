"""The one loop that runs a step to completion over one transport's share or several.

Every share moves what it can without blocking; only when none moved does the loop block.
A share alone waits its own way (``poll`` on sockets, a futex sleep on shared memory). Beside
others the loop cannot sleep on all of them at once, so it checks the others for a failed
peer and blocks on the last share for a short slice, then looks at every share again: list
the share that waits on file descriptors (TCP) last.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter_ns
from typing import Any

from cclctl.runtime.transport.base import Progress, Transfer, Wait

MIXED_SLICE_S = 0.001  # with several shares stuck: how long to block on the last one
#: kinds of time blocked on a peer (telemetry's PeerWaits indices): sending or receiving
#: after the peer showed progress in the call (the data phase), and before (its entry);
#: and the time a peer's message took from its first byte to its last (see transferred)
SEND_WAIT, RECV_WAIT, ENTRY_SEND_WAIT, ENTRY_RECV_WAIT, RECV_TRANSFER = 0, 1, 2, 3, 4


def drive(shares: Sequence[Progress], wait: Wait) -> None:
    """Advance ``shares`` until every one is done, blocking only when none can move."""
    if len(shares) == 1:
        _drive_one(shares[0], wait)
        return
    live = [share for share in shares if not share.done]
    blocked: Progress | None = None  # the share last blocked on, and its peer
    peer = -1
    while live:
        moved = False
        for share in live:
            if share.advance():
                moved = True
                if share is blocked and wait.waits is not None:  # see _drive_one_timed
                    arrived(wait, peer)
                    blocked = None
        live = [share for share in live if not share.done]
        if moved or not live:
            continue
        if len(live) == 1:
            blocked, peer = live[0], _block(live[0], wait, None)
            continue
        for share in live[:-1]:
            share.check()
        blocked, peer = live[-1], _block(live[-1], wait, MIXED_SLICE_S)


def _drive_one(share: Progress, wait: Wait) -> None:
    if wait.waits is not None:
        _drive_one_timed(share, wait)
        return
    while not share.done:
        if not share.advance() and not share.done:
            _block(share, wait, None)


def _drive_one_timed(share: Progress, wait: Wait) -> None:
    """:func:`_drive_one`, telling a peer's arrival apart: once a share that blocked on a
    peer moves again, that peer has shown progress in the call (its bytes came, or it
    took some)."""
    blocked = -1
    while not share.done:
        if share.advance():
            if blocked >= 0:
                arrived(wait, blocked)
                blocked = -1
        elif not share.done:
            blocked = _block(share, wait, None)


def _block(share: Progress, wait: Wait, slice_s: float | None) -> int:
    """Block on the peer ``share`` waits on; returns that peer. With telemetry's
    ``wait.waits``, the time blocked is added to the peer's (see :func:`account`)."""
    peer, what = share.waiting_on()
    wait.blocked_on(peer, what)
    if wait.waits is None:
        share.block(wait, peer, what, slice_s)
        return peer
    began = perf_counter_ns()
    try:
        share.block(wait, peer, what, slice_s)
    finally:
        account(wait, peer, what, perf_counter_ns() - began)
    return peer


def account(wait: Wait, peer: int, what: str, ns: int, arrive: bool = False) -> None:
    """Add ``ns`` blocked on ``peer`` (the communicator's rank) to ``wait.waits``, under the
    peer's job rank: entry wait while the peer has shown no progress in the call (no byte
    of it received in a step that completed, no move after a wait on it), else send or
    receive wait (the data phase). ``arrive``: the wait ended with the peer's progress.

    One call per wait, inlined: it runs as the wait ends, on the call's critical path."""
    peers = wait.arrived
    if peers is None:
        peers = wait.arrived = set()
    exchanged = wait.exchanged
    if exchanged:  # the receives of completed steps: their peers had sent
        for recvs in exchanged:
            peers.update(p for p, _ in recvs)
        exchanged.clear()
    send = what == "send"
    if peer in peers:
        kind = SEND_WAIT if send else RECV_WAIT
    else:
        kind = ENTRY_SEND_WAIT if send else ENTRY_RECV_WAIT
        if arrive:
            peers.add(peer)
    _peer_row(wait, peer)[kind] += ns


def transferred(wait: Wait, peer: int, ns: int) -> None:
    """A message from ``peer`` (the communicator's rank) took ``ns`` from its first byte
    to its last: the link's own time to deliver it, which no wait of the peer's on others
    lengthens (its sender had sent it, or was sending it). Added to ``wait.waits`` under
    the peer's job rank; a message that arrived whole in one read adds nothing."""
    _peer_row(wait, peer)[RECV_TRANSFER] += ns


def _peer_row(wait: Wait, peer: int) -> list[int]:
    """``peer``'s (the communicator's rank) row of ``wait.waits``, under its job rank."""
    members = wait.failure.members
    job = members[peer] if members and 0 <= peer < len(members) else peer
    totals = wait.waits.totals
    row = totals.get(job)
    if row is None:
        row = totals[job] = [0, 0, 0, 0, 0]
    return row


def arrived(wait: Wait, peer: int) -> None:
    """``peer`` has shown progress in the call: later waits on it are the data phase."""
    peers = wait.arrived
    if peers is None:
        wait.arrived = {peer}
    else:
        peers.add(peer)


def exchanged(wait: Wait, recvs: Sequence[Transfer]) -> None:
    """A step completed: the peers it received from have shown progress in the call
    (kept as the list itself, looked at only if the call blocks later)."""
    done = wait.exchanged
    if done is not None and recvs:
        done.append(recvs)


class DrivenAlone:
    """``exchange`` for a transport that drives its own steps: start one, drive it."""

    def start(
        self, call: Any, step: int, sends: Sequence[Transfer], recvs: Sequence[Transfer], wait: Wait
    ) -> Progress:
        raise NotImplementedError

    def exchange(
        self, call: Any, step: int, sends: Sequence[Transfer], recvs: Sequence[Transfer], wait: Wait
    ) -> None:
        drive((self.start(call, step, sends, recvs, wait),), wait)
        exchanged(wait, recvs)
