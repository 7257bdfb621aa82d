"""Messages between two ranks over the job's own transport, each with a deadline of its own.

A probe must outlive a dead or unreachable partner, so its transfers stay out of the
communicator's failure state: a failed collective fails the whole communicator and tells
every rank (``runtime/failure.py``), which would end the schedule for all. Here each
message is one ``Transport.exchange`` under a :class:`FailureState` of the probe's own that
announces nothing, and a failure ends only the pair it happened in: the schedule meets every
pair once, so a link that may hold half a message is never used again. Headers carry a tag
of their own (``probe:<comm>``), so a probe message can never pass for a collective's.
"""

from __future__ import annotations

import time

from cclctl.errors import CclError
from cclctl.runtime.failure import OK, FailureState
from cclctl.runtime.transport.base import Transport, Wait
from cclctl.runtime.transport.wire import Call, comm_tag

#: What a failed transfer raises: the runtime's typed errors, and the socket's own.
FAILURES = (CclError, OSError)


class Channel:
    """This rank's probe messages to its peers, over ``transport``."""

    def __init__(self, transport: Transport, rank: int, comm_id: str, epoch: int) -> None:
        self.transport = transport
        self.rank = rank
        self._comm = f"probe:{comm_id}"
        self._tag = comm_tag(self._comm)
        self._epoch = epoch
        self._failure = FailureState(rank, self._comm)

    def move(
        self,
        peer: int,
        seq: int,
        step: int,
        timeout_s: float,
        send: memoryview | None = None,
        recv: memoryview | None = None,
    ) -> None:
        """Send ``send`` to and/or receive ``recv`` from ``peer`` within ``timeout_s``;
        raises one of :data:`FAILURES` when the deadline passes or the link breaks."""
        size = len(send) if send is not None else len(recv) if recv is not None else 0
        call = Call(self._tag, self._epoch, seq, "send", "uint8", count=size)
        now = time.monotonic()
        wait = Wait(self.rank, None, now + timeout_s, now, self._failure, partners_only=True)
        try:
            self.transport.exchange(
                call,
                step,
                [(peer, send)] if send is not None else [],
                [(peer, recv)] if recv is not None else [],
                wait,
            )
        except FAILURES:
            if self._failure.status is not OK:  # a peer's revoke frame reached it: fresh one
                self._failure = FailureState(self.rank, self._comm)
            raise
