"""Counters that other parts of the process keep and telemetry reads when it looks.

The transports count bytes, refused handshakes and resumed links per peer; the store's rank
counts what its store turned away; the transports add the time they block on each peer into
:class:`~.windows.PeerWaits`. None of it runs on the hot path: these are read only when a
scrape, a status or the slowness signals' windows ask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cclctl.telemetry.counters import StoreCounts
from cclctl.telemetry.windows import PeerTotals, PeerWaits

#: Returns bytes sent to and received from each peer so far, both indexed by peer rank.
LinkSource = Callable[[], tuple[Sequence[int], Sequence[int]]]


class CounterSources:
    """The process's counter sources, registered once and read at scrape or status time.

    :class:`~.hub.Telemetry` offers the ``add_*`` registrations, bound once, as its own.
    """

    def __init__(self) -> None:
        self.links: list[LinkSource] = []
        self.store: Callable[[], StoreCounts] | None = None
        self.auth_failures: list[Callable[[], int]] = []
        self.resumes: list[Callable[[], Sequence[int]]] = []
        #: how each peer is reached, ``shm`` or ``tcp`` (unnamed: ``tcp``)
        self.vias: dict[int, str] = {}
        #: where the runtime's transports add the time they block on each peer
        self.peer_waits = PeerWaits()

    def add_store_source(self, source: Callable[[], StoreCounts]) -> None:
        """On the rank that hosts the job's store: read what it turned away, at scrape time."""
        self.store = source

    def add_link_source(self, source: LinkSource) -> None:
        """Read per-peer link bytes from a transport that already counts them.

        The transport's counters are read only when metrics or a status are built, so the
        hot path pays nothing for per-peer accounting.
        """
        self.links.append(source)

    def add_vias(self, vias: dict[int, str]) -> None:
        """Say how each peer (a job rank) is reached, ``shm`` or ``tcp``, for the signals."""
        self.vias.update(vias)

    def add_auth_failure_source(self, source: Callable[[], int]) -> None:
        """Read how many link handshakes the transport refused (a stranger, a wrong token)."""
        self.auth_failures.append(source)

    def add_resume_source(self, source: Callable[[], Sequence[int]]) -> None:
        """Read how many links to each peer the transport made again after a reset."""
        self.resumes.append(source)

    def add_link_bytes(self, links: dict[int, tuple[int, int]]) -> None:
        """Add each transport's bytes sent to and received from every peer into ``links``."""
        for source in self.links:
            sent, received = source()
            for peer, (s, r) in enumerate(zip(sent, received, strict=True)):
                if s or r:
                    old = links.get(peer, (0, 0))
                    links[peer] = (old[0] + s, old[1] + r)

    def link_resumes(self) -> dict[int, int]:
        """How many links to each peer the transports made again after a reset (non-zero)."""
        resumes: dict[int, int] = {}
        for resumed in self.resumes:
            for peer, n in enumerate(resumed()):
                if n:
                    resumes[peer] = resumes.get(peer, 0) + n
        return resumes

    def store_counts(self) -> StoreCounts | None:
        """What the job's store turned away, on the rank that hosts it (else None)."""
        return self.store() if self.store is not None else None

    def auth_failure_count(self) -> int:
        """Link handshakes the transports refused (a stranger, a wrong token)."""
        return sum(source() for source in self.auth_failures)

    def peer_totals(self) -> PeerTotals:
        """Each peer's running totals for the signals' windows (see telemetry/windows.py):
        bytes from the transports' own counters, time blocked and messages' transfer times
        from :attr:`peer_waits`."""
        links: dict[int, tuple[int, int]] = {}
        self.add_link_bytes(links)
        waits = self.peer_waits.copy()
        transfers = self.peer_waits.transfers()
        totals = {}
        for peer in links.keys() | waits.keys():
            bytes_sent, bytes_received = links.get(peer, (0, 0))
            send_wait, recv_wait, entry_send, entry_recv = waits.get(peer, (0, 0, 0, 0))
            via = self.vias.get(peer, "tcp")
            entry_wait = entry_send + entry_recv
            totals[peer] = (via, bytes_sent, bytes_received, send_wait, recv_wait, entry_wait,
                            transfers.get(peer, 0))  # fmt: skip
        return totals
