"""What opening a transport needs to learn from the other ranks: the transport's meeting.

:func:`~cclctl.runtime.transport.hybrid.build_transport` chooses TCP, shared memory or both
from the same facts on every rank, and reads them through a :class:`TransportMeeting`:

- :meth:`~TransportMeeting.meet`: every rank's host key (ranks with equal keys can map
  each other's segments), whether any rank asked for TCP, and every rank's TCP address
  (a sequence by rank, which may fetch an address only when it is first read: a rank
  reads only the addresses of the peers it dials);
- :meth:`~TransportMeeting.segments`: the names of the shared-memory segments of this
  rank's host's ranks (every rank of the job calls it, together);
- :meth:`~TransportMeeting.mapped`: the job-wide verdict that every host mapped its
  segments, the same on every rank, so the whole job falls back to TCP in agreement.

:class:`ExchangeMeeting` learns all of it through an :data:`Exchange`, in which every rank
publishes one value and reads every rank's: three rounds ("transport", "shm/segments",
"shm/mapped"). The flat rendezvous and the communicators made after the job's own (a
shrink, a retry, a subgroup) meet this way. A job that joined through its host agents
meets through their world document instead (:mod:`cclctl.runtime.job.fanin_meeting`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

#: Publish ``value`` under ``key`` and return every rank's value by rank (all ranks call it).
Exchange = Callable[[str, bytes], list[bytes]]


@dataclasses.dataclass(frozen=True)
class Roster:
    """What every rank learns before the choice: host keys and TCP addresses by rank."""

    keys: Sequence[str]  # equal for ranks that can share memory
    tcp_asked: bool  # some rank was configured with CCLCTL_TRANSPORT=tcp
    addresses: Sequence[str]  # TCP addresses (read an item only to dial that peer)


class SegmentMeeting(Protocol):
    """The shared-memory setup's two rounds (:func:`~.shm.transport.open_group`)."""

    def segments(self, local: Sequence[int], name: bytes) -> Mapping[int, bytes]:
        """Publish this rank's segment name (empty: none); the names of ``local`` (this
        host's ranks, this one included) by rank."""
        ...

    def mapped(self, problem: str) -> bool:
        """Publish why this rank could not map its host's segments ("" if it did);
        whether every rank of the job did."""
        ...


class TransportMeeting(SegmentMeeting, Protocol):
    """Everything the transport's choice reads of the other ranks."""

    def meet(self, choice: str, host: str, address: str) -> Roster:
        """Publish this rank's configured transport, host key and TCP address."""
        ...


class ExchangeMeeting:
    """The meeting as rounds of an :data:`Exchange`: every rank reads every rank's value."""

    def __init__(self, exchange: Exchange) -> None:
        self._exchange = exchange

    def meet(self, choice: str, host: str, address: str) -> Roster:
        mine = {"transport": choice, "host": host, "tcp": address}
        infos = [json.loads(raw) for raw in self._exchange("transport", json.dumps(mine).encode())]
        return Roster(
            keys=[str(info["host"]) for info in infos],
            tcp_asked=any(info["transport"] == "tcp" for info in infos),
            addresses=[str(info["tcp"]) for info in infos],
        )

    def segments(self, local: Sequence[int], name: bytes) -> Mapping[int, bytes]:
        names = self._exchange("shm/segments", name)
        return {r: names[r] for r in local}

    def mapped(self, problem: str) -> bool:
        return not any(self._exchange("shm/mapped", problem.encode()))


def as_meeting(meeting: TransportMeeting | Exchange) -> TransportMeeting:
    """``meeting`` itself, or an :class:`ExchangeMeeting` over an exchange."""
    return ExchangeMeeting(meeting) if callable(meeting) else meeting
