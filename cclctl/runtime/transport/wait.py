"""How long a step may block and whom it waits on; the transfers a step moves.

Every transport and engine takes a :class:`Wait` (declared here, below the transport
interface of :mod:`~cclctl.runtime.transport.base` and the engines of
:mod:`~cclctl.runtime.transport.engines`, which both name it).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

from cclctl.records import CollectiveRecord
from cclctl.runtime.failure import OK, FailureState
from cclctl.runtime.failure_errors import timeout_error
from cclctl.runtime.transport.wire import Call

#: One transfer of a step: the peer rank and the bytes to send or to receive into.
Transfer = tuple[int, memoryview]
#: A range of addresses, ``[start, end)``.
Span = tuple[int, int]


@dataclasses.dataclass(slots=True)
class Wait:
    """How long a step may block, and where it reports whom it is waiting on.

    ``record`` is the collective's live trace record: transports set its ``waiting_on`` and
    ``waiting_for`` before they block, which is what the watchdog, ``cclctl top`` and
    ``cclctl diagnose hang`` read. ``failure`` is the communicator's failure state: once it
    fails (an abort, the watchdog, a close), a blocked step gives up promptly. Transports
    name peers as the communicator numbers them; what leaves here (the record, a timeout)
    names the job's ranks (``failure.job_rank``), as ``rank`` is.
    """

    rank: int
    record: CollectiveRecord | None = None
    deadline: float = math.inf  # time.monotonic() seconds
    started: float = dataclasses.field(default_factory=time.monotonic)
    failure: FailureState = dataclasses.field(default_factory=FailureState)
    #: where the time blocked on each peer is added (telemetry's ``PeerWaits``; None: off)
    #: and, per call, the peers that have shown progress in it (see transport/drive.py)
    waits: Any = None
    arrived: set[int] | None = None
    exchanged: list[Sequence[Transfer]] | None = None
    #: watch only the peers the step moves bytes with for a failure, not every peer: a
    #: probe's pair outlives a third rank's death (a collective fails with any peer)
    partners_only: bool = False
    #: the call's memory that holds nothing but its final bytes from when they are first
    #: sent until every rank holds its result whole (an all_gather's or a broadcast's output
    #: where the call ends with a confirm); a link keeps a view of a sent message's
    #: unacknowledged end there for a resume, not a copy (None: copy every tail)
    settled: Span | None = None

    def blocked_on(self, peer: int, what: str) -> None:
        rec = self.record
        if rec is not None:
            rec.waiting_on = self.failure.job_rank(peer)
            rec.waiting_for = what

    def check(self, call: Call, peer: int, what: str) -> float:
        """Raise if the step must stop waiting; otherwise return the seconds left."""
        failure = self.failure
        if failure.status is not OK:
            elapsed = time.monotonic() - self.started
            failure.stop(call.what(), call.op, call.seq, failure.job_rank(peer), what, elapsed)
        now = time.monotonic()
        if now >= self.deadline:
            peer = failure.job_rank(peer)
            timeout_error(self.rank, call.op, call.seq, peer, what, now - self.started)
        return self.deadline - now
