"""The slowness signals of one process, folded into windows (see :mod:`cclctl.slow_signals`).

:class:`Windows` sees every record the recorder folds (once, as it is taken from the queue)
and adds it to the windows of ``window_s`` seconds it touches, cut on this process's wall
clock at multiples of the window since the epoch, so every rank's windows line up to the
clock skew: the calls that ended in each, the time spent inside calls in each (a call that
spans a boundary is split at it, and one still running when a window closes counts up to
its end) and, for collectives, sampled entry times ``(seq, start_ns)`` (the seqs whose
:func:`~cclctl.slow_signals.seq_hash` has its low bits 0, as many bits as keep at most
:data:`~cclctl.slow_signals.MAX_ENTRIES`, so every rank keeps the same seqs and every call
position of a training step is sampled alike). The calls' own folds only hand the records
over (:meth:`Windows.defer`, under the recorder's lock: a list append per fold);
:meth:`Windows.update`, as each status is built (at least once a status interval, on the
publisher's thread, under a lock of its own), adds them and closes the windows that ended,
so the windows cost the calls nothing more. The per-peer totals (bytes, time blocked,
messages' transfer times) are read then, and their growth since the last close is the
window's, so a window's peers may hold up to a status interval of the next window's. Only
the last :data:`~cclctl.slow_signals.MAX_WINDOWS` complete windows are kept.

:class:`PeerWaits` is where the runtime's transports add the time they block on a peer and
the time a peer's TCP messages take to arrive.
The clock is injectable, as the watchdog's, for tests.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cclctl.records import CollectiveRecord
from cclctl.slow_signals import (
    MAX_COMMS,
    MAX_ENTRIES,
    MAX_PEERS,
    MAX_WINDOWS,
    SEQ_HASH,
    SEQ_HASH_SHIFT,
    CommWindow,
    PeerWindow,
    Signals,
    Window,
    seq_hash,
)

#: Records deferred by the calls' own folds before one is made to add them (a process whose
#: telemetry no reader folds: no status publisher, no watchdog).
MAX_DEFERRED = 1 << 15

#: index of each total in :class:`PeerWaits`: sending, receiving (after the peer showed
#: progress in the call: the data phase), and before it did (entry), sending or receiving;
#: and the time the peer's messages took from their first byte to their last (TCP)
SEND_WAIT, RECV_WAIT, ENTRY_SEND_WAIT, ENTRY_RECV_WAIT, RECV_TRANSFER = 0, 1, 2, 3, 4

#: peer (job rank) -> (via, sent, received, send_wait_ns, recv_wait_ns, entry_wait_ns,
#: recv_transfer_ns), each number a running total since the process started (a total
#: left off the end reads as 0)
PeerTotals = Mapping[int, tuple[Any, ...]]


class PeerWaits:
    """Nanoseconds this process blocked on each peer (a job rank) so far, sending and
    receiving, after the peer showed progress in the call and before (entry), and the
    nanoseconds the peer's messages took to arrive, first byte to last.

    Written by the thread that runs the calls, read by folds on other threads: a reader
    copies the table at once (``list`` of a dict is one step under the GIL). The runtime
    adds to :attr:`totals` itself (runtime/transport/drive.py), as :meth:`add` does."""

    __slots__ = ("totals",)

    def __init__(self) -> None:
        self.totals: dict[int, list[int]] = {}

    def add(self, peer: int, kind: int, ns: int) -> None:
        """Add ``ns`` blocked on ``peer`` as ``kind`` (an index above)."""
        row = self.totals.get(peer)
        if row is None:
            row = self.totals[peer] = [0, 0, 0, 0, 0]
        row[kind] += ns

    def copy(self) -> dict[int, tuple[int, int, int, int]]:
        """peer -> (send, recv, entry send, entry recv) nanoseconds."""
        return {peer: (r[0], r[1], r[2], r[3]) for peer, r in list(self.totals.items())}

    def transfers(self) -> dict[int, int]:
        """peer -> nanoseconds its messages took to arrive, first byte to last."""
        return {peer: r[RECV_TRANSFER] for peer, r in list(self.totals.items())}


class _Comm:
    """One communicator in an open window: its counts and its sampled entries."""

    __slots__ = ("calls", "entries", "inside", "mask")

    def __init__(self) -> None:
        self.calls = 0
        self.inside = 0
        self.entries: list[tuple[int, int]] = []
        self.mask = 0  # keep an entry when seq_hash(seq) & mask == 0 (mask = 2**k - 1)

    def thin(self) -> None:
        """Over :data:`MAX_ENTRIES`: the next level keeps about every other kept seq."""
        entries = self.entries
        while len(entries) > MAX_ENTRIES:
            self.mask = 2 * self.mask + 1
            entries[:] = [e for e in entries if not seq_hash(e[0]) & self.mask]


class Windows:
    """Rolling per-window summaries of one process's calls and peers."""

    def __init__(
        self,
        window_s: float,
        peers: Callable[[], PeerTotals] | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.window_s = window_s
        self.window_ns = max(1, int(window_s * 1e9))
        #: the per-peer running totals, read as a window closes (None: no peers)
        self.peers = peers
        self._clock = clock
        self._open: dict[int, dict[str, _Comm]] = {}  # window index -> comms
        self._done: collections.deque[Window] = collections.deque(maxlen=MAX_WINDOWS)
        self._running: dict[int, list] = {}  # id(record) -> [record, counted up to (ns)]
        self._next = clock() // self.window_ns  # the first window not closed yet
        self._last: dict[int, tuple[Any, ...]] = {}
        self._deferred: list[list[CollectiveRecord]] = []  # taken, not added yet
        self._deferred_count = 0
        self._hand_over = threading.Lock()  # guards the two above
        self._work = threading.Lock()  # guards everything else

    # -- feeding (the recorder calls these under its lock) -----------------------------------

    def defer(self, records: list[CollectiveRecord]) -> None:
        """Keep records a fold took (each exactly once, in order) for :meth:`update`; past
        :data:`MAX_DEFERRED` of them (nothing updates: no status publisher), add them now."""
        with self._hand_over:
            self._deferred.append(records)
            self._deferred_count += len(records)
            over = self._deferred_count > MAX_DEFERRED
        if over:
            self.update()

    def update(self) -> Signals:
        """Add the records handed over so far, close the windows that ended, and return
        the complete ones."""
        with self._work:
            with self._hand_over:
                deferred, self._deferred, self._deferred_count = self._deferred, [], 0
            self._take_ended()
            for batch in deferred:
                self.take(batch)
            self.close_due()
            return Signals(self.window_s, list(self._done))

    def _take_ended(self) -> None:
        """Add the calls taken earlier, still running then, that have ended since."""
        running = self._running
        for key, item in list(running.items()):
            rec = item[0]
            if rec.end_ns:
                del running[key]
                self._inside(rec.comm, item[1], rec.end_ns, True)

    def take(self, records: Iterable[CollectiveRecord]) -> None:
        """Add records taken from the recorder's queue (the caller holds the work lock).

        The usual record (a collective that started and ended in one open window, of the
        communicator of the record before it) costs a few attribute reads and adds."""
        running = self._running
        window_ns, opened = self.window_ns, self._open
        at, until = -1, -1  # the window of the record before, and where it ends (ns)
        comms: dict[str, _Comm] | None = None
        name: str | None = None
        comm: _Comm | None = None
        for rec in records:
            start = rec.start_ns
            if not at * window_ns <= start < until:
                at = start // window_ns
                until = (at + 1) * window_ns
                comms = opened.get(at)
                if comms is None:
                    comms = self._window(at)
                name = None
            if rec.comm is not name:
                name = rec.comm
                comm = None if comms is None else (comms.get(name) or self._comm(comms, name))
            if comm is not None and rec.peer is None:
                seq = rec.seq
                if not (seq * SEQ_HASH >> SEQ_HASH_SHIFT) & comm.mask:  # seq_hash, inlined
                    comm.entries.append((seq, start))
                    if len(comm.entries) > MAX_ENTRIES:
                        comm.thin()
            end = rec.end_ns
            if not end:
                running[id(rec)] = [rec, start]
            elif comm is not None and start <= end < until:
                comm.inside += end - start
                comm.calls += 1
            else:
                self._inside(rec.comm, start, end, True)

    def _window(self, index: int) -> dict[str, _Comm] | None:
        """The comms of open window ``index``, opened now; None once it closed (or far
        ahead of this clock: a record's time from a clock that stepped)."""
        if index < self._next or index > self._clock() // self.window_ns + 1:
            return None
        return self._open.setdefault(index, {})

    @staticmethod
    def _comm(comms: dict[str, _Comm], name: str) -> _Comm | None:
        if len(comms) >= MAX_COMMS:
            return None  # a rank's 33rd communicator is left out of its signals
        comm = comms[name] = _Comm()
        return comm

    def _inside(self, name: str, start: int, end: int, ended: bool) -> None:
        """Add the time ``[start, end)`` inside a call of ``name`` to the windows it
        spans; ``ended``: the call ended at ``end`` (counted in that window)."""
        window_ns = self.window_ns
        end = max(start, end)
        first = max(start // window_ns, self._next)
        last = max(start, end - 1) // window_ns
        for index in range(first, last + 1):
            comms = self._open.get(index) or self._window(index)
            if comms is None:
                continue
            comm = comms.get(name) or self._comm(comms, name)
            if comm is None:
                continue
            lo, hi = max(start, index * window_ns), min(end, (index + 1) * window_ns)
            comm.inside += max(0, hi - lo)
            if ended and index == last:
                comm.calls += 1

    # -- closing ------------------------------------------------------------------------------

    def close_due(self) -> None:
        """Close every window that ended by now (the caller holds the work lock)."""
        window_ns = self.window_ns
        now = self._clock() // window_ns
        if now <= self._next:
            return
        if now - self._next > MAX_WINDOWS:  # idle for long, or the clock jumped: skip ahead
            for index in [i for i in self._open if i < now - MAX_WINDOWS]:
                del self._open[index]
            self._next = now - MAX_WINDOWS
        for item in self._running.values():  # calls still running: up to the last end
            rec, counted = item
            until = now * window_ns
            if counted < until:
                self._inside(rec.comm, counted, until, False)
                item[1] = until
        peers = self._peer_deltas()
        while self._next < now:
            index = self._next
            comms = self._open.pop(index, {})
            self._next = index + 1
            self._done.append(
                Window(
                    index * window_ns,
                    (index + 1) * window_ns,
                    {n: CommWindow(c.calls, c.inside, c.entries) for n, c in comms.items()},
                    peers if self._next == now else {},
                )
            )

    def _peer_deltas(self) -> dict[int, PeerWindow]:
        """What each peer's totals grew by since the last close (peers that did not grow
        are left out; at most :data:`MAX_PEERS`, the busiest)."""
        if self.peers is None:
            return {}
        totals = dict(self.peers())
        last, self._last = self._last, totals
        grown: dict[int, PeerWindow] = {}
        for peer, now in totals.items():
            before = last.get(peer, ())[1:]
            delta = [max(0, a - b) for a, b in itertools.zip_longest(now[1:], before, fillvalue=0)]
            if any(delta):
                grown[peer] = PeerWindow(now[0], *delta)
        if len(grown) > MAX_PEERS:
            busiest = sorted(grown, key=lambda p: -(grown[p].sent + grown[p].received))
            grown = {p: grown[p] for p in sorted(busiest[:MAX_PEERS])}
        return grown

    def signals(self) -> Signals:
        """The complete windows, oldest first, as the last :meth:`update` left them."""
        with self._work:
            return Signals(self.window_s, list(self._done))
