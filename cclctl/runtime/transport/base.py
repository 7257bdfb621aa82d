"""The interface between algorithms and the wires that move their bytes.

Algorithms describe each step of a collective as a set of sends and receives between this
rank and its peers; a transport completes the whole set, in any order, without deadlock.
That one call is enough for rings, trees, recursive doubling and pairwise exchanges, and it
lets a shared-memory transport slot in beside TCP without touching the algorithms.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from cclctl.errors import CollectiveTimeout, CommAborted
from cclctl.records import TIMED_OUT, CollectiveRecord
from cclctl.runtime.transport.capabilities import Capabilities
from cclctl.runtime.transport.wire import Call

#: One transfer of a step: the peer rank and the bytes to send or to receive into.
Transfer = tuple[int, memoryview]


def _never_aborted() -> str | None:
    return None


@dataclasses.dataclass(slots=True)
class Wait:
    """How long a step may block, and where it reports whom it is waiting on.

    ``record`` is the collective's live trace record: transports set its ``waiting_on`` and
    ``waiting_for`` before they block, which is what the watchdog, ``cclctl top`` and
    ``cclctl diagnose hang`` read. ``aborted`` returns a reason once the communicator was
    aborted (by a peer, the watchdog or an operator), so a blocked step gives up promptly.
    """

    rank: int
    record: CollectiveRecord | None = None
    deadline: float = math.inf  # time.monotonic() seconds
    started: float = dataclasses.field(default_factory=time.monotonic)
    aborted: Callable[[], str | None] = _never_aborted
    watched: bool = False  # a watchdog marks the record timed_out; raise when it does

    def blocked_on(self, peer: int, what: str) -> None:
        rec = self.record
        if rec is not None:
            rec.waiting_on = peer
            rec.waiting_for = what

    def check(self, call: Call, peer: int, what: str) -> float:
        """Raise if the step must stop waiting; otherwise return the seconds left."""
        reason = self.aborted()
        if reason is not None:
            raise CommAborted(
                f"rank {self.rank}: {call.op} seq {call.seq} aborted ({reason})",
                rank=self.rank,
                peer=peer,
                seq=call.seq,
                op=call.op,
                reason=reason,
            )
        now = time.monotonic()
        timed_out = self.watched and self.record is not None and self.record.state == TIMED_OUT
        if timed_out or now >= self.deadline:
            elapsed = now - self.started
            raise CollectiveTimeout(
                f"rank {self.rank}: {call.op} seq {call.seq} timed out after {elapsed:.1f}s "
                f"waiting to {what} {'to' if what == 'send' else 'from'} rank {peer}",
                rank=self.rank,
                peer=peer,
                seq=call.seq,
                op=call.op,
                elapsed=round(elapsed, 3),
                waiting_for=what,
            )
        return self.deadline - now


class Transport(Protocol):
    """Moves the bytes of one algorithm step between this rank and its peers."""

    name: str
    capabilities: Capabilities  # the engines beside point-to-point steps (selection reads it)

    def exchange(
        self,
        call: Call,
        step: int,
        sends: Sequence[Transfer],
        recvs: Sequence[Transfer],
        wait: Wait,
    ) -> None:
        """Send and receive every transfer of ``step``; at most one each way per peer.

        Every message is preceded by a header naming ``call`` and ``step``; a received
        header that does not match raises :class:`~cclctl.errors.ProtocolError`.
        """
        ...

    def drop_link(self, peer: int) -> None:
        """Close the link to ``peer`` (fault injection; the next use reconnects)."""
        ...

    def link_bytes(self) -> tuple[list[int], list[int]]:
        """Bytes sent to and received from each peer so far (indexed by rank)."""
        ...

    def close(self) -> None: ...
