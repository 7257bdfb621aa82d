"""Waiting on the peers of one host: wake-ups, adaptive spins, futex sleeps, liveness.

A wait first looks once (most small-message waits end there), then spins briefly, then
yields the core for up to a millisecond, then sleeps on this rank's futex word. Peers bump
that word after they publish, but only when they see this rank's ``sleeping`` flag, so a
run where every rank has its own core makes no system call at all, while one with more
ranks than cores hands the core to the awaited rank instead of burning it. Every sleep is
bounded, so a dead peer (its pidfd turns readable), a peer that failed (its ``state``
word), the deadline and an abort are all seen within one slice.
"""

from __future__ import annotations

import math
import os
import select
import threading
import time
from collections.abc import Callable, Collection, Sequence

from cclctl import revocation
from cclctl.errors import BadInput, CclError, PeerError
from cclctl.revocation import Revocation
from cclctl.runtime.failure_errors import revoked
from cclctl.runtime.peer_process import GONE
from cclctl.runtime.transport import drive, wire
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.shm.futex import Futex
from cclctl.runtime.transport.shm.layout import (
    MASK32,
    STATE_BROKEN,
    STATE_CLOSED,
    STATE_OK,
    W_SLEEPING,
    W_STATE,
    W_WAKE,
    View,
)

SLEEP_SLICE_S = 0.02  # the longest a sleeper goes without re-checking liveness and deadline


class HostPeers:
    """How this rank waits on, wakes and watches the other ranks of its host."""

    def __init__(
        self,
        rank: int,
        views: Sequence[View],
        local: int,
        *,
        spin_s: float,
        yield_s: float,
        futex: Futex,
    ) -> None:
        self.rank = rank
        self.views = list(views)  # by local index
        self.local = local
        self.me = self.views[local]
        self.others = [v for v in self.views if v is not self.me]
        self.spin_s = spin_s  # the longest busy spin
        self.spin = spin_s  # the current one (see wait_counter)
        self.yield_s = yield_s
        self.futex = futex
        self._pids_checked = time.monotonic()
        #: this rank's threads asleep in :meth:`block` (the torch backend's lanes wait on two
        #: at once): the one ``W_SLEEPING`` flag stays up until the last of them wakes
        self._sleepers = 0
        self._sleepers_lock = threading.Lock()

    def notify(self) -> None:
        """After publishing: wake the peers that went to sleep (fence first, see shm_signal)."""
        self.futex.fence()
        for view in self.others:
            i = view.i
            if i[W_SLEEPING]:
                i[W_WAKE] = (i[W_WAKE] + 1) & MASK32
                self.futex.wake(view.wake_addr)

    def wait_counter(
        self, view: View, index: int, target: int, call: wire.Call, wait: Wait, what: str
    ) -> None:
        """Return once ``view``'s counter ``index`` reaches ``target``.

        The busy spin adapts: it doubles after a wait that it ended and halves after one it
        did not, so when the ranks share cores (a loaded machine) it shrinks toward zero
        and the rank yields at once to whoever holds the answer.
        """
        q = view.q
        if q[index] >= target:
            return
        waited = self._await_counter(view, index, target, call, wait, what)
        if wait.waits is not None:  # the signals: time blocked on the peer (drive.py)
            drive.account(wait, view.rank, what, int(waited * 1e9), True)

    def _await_counter(
        self, view: View, index: int, target: int, call: wire.Call, wait: Wait, what: str
    ) -> float:
        """The spin, the yield and the sleep of :meth:`wait_counter`; returns the seconds
        waited, read off the clock the spin reads anyway (a spin's last look is at most one
        turn of the loop old), so timing a wait costs it no clock of its own."""
        q = view.q
        start = now = time.perf_counter()
        busy, polite = now + self.spin, now + self.spin + self.yield_s
        while True:  # spin: the peer is usually running on another core right now
            if q[index] >= target:
                self.spin = min(self.spin_s, 2 * self.spin + 1e-6)
                return now - start
            now = time.perf_counter()
            if now >= busy:
                break
        self.spin *= 0.5
        while now < polite:  # yield: or it waits for the core this rank is holding
            os.sched_yield()
            if q[index] >= target:
                return now - start
            now = time.perf_counter()
        self.block(lambda: q[index] >= target, view.rank, what, call, wait)
        return time.perf_counter() - start

    def block(
        self,
        ready: Callable[[], bool],
        peer: int,
        what: str,
        call: wire.Call,
        wait: Wait,
        limit_s: float = math.inf,
        watched: Collection[int] | None = None,
        partners: Collection[int] = (),
    ) -> None:
        """Sleep until ``ready()``, or at most ``limit_s``; ``peer`` is whom the trace says
        this rank waits on; ``watched``: the peers whose failure ends the wait (None: all);
        ``partners``: see :meth:`check_peers`."""
        wait.blocked_on(peer, what)
        me = self.me.i
        until = time.monotonic() + limit_s
        self._asleep(1)
        try:
            while True:
                seen = me[W_WAKE]
                me[W_SLEEPING] = 1
                self.futex.fence()
                if ready():
                    return
                wait.check(call, peer, what)
                self.check_peers(call, peer, ready, watched, partners)
                left = until - time.monotonic()
                if left <= 0:
                    return
                self.futex.wait(self.me.wake_addr, seen, min(SLEEP_SLICE_S, left))
        finally:
            self._asleep(-1)

    def _asleep(self, change: int) -> None:
        """Count a thread into (1) or out of (-1) :meth:`block`; the flag peers read before
        waking this rank is down only while none sleeps."""
        with self._sleepers_lock:
            self._sleepers += change
            if not self._sleepers:
                self.me.i[W_SLEEPING] = 0

    def check_peers(
        self,
        call: wire.Call,
        peer: int,
        ready: Callable[[], bool],
        watched: Collection[int] | None = None,
        partners: Collection[int] = (),
    ) -> None:
        """Raise if the awaited peer, or any peer (of ``watched``, where given), failed,
        closed or died: with the record of the job's failure where the peer left one, so
        the error names its origin. Not once ``ready()`` holds: a peer that wrote what this
        rank waits for and then left (it closed after its last call, or died) left that
        behind, readable.

        A peer that closed its communicator cleanly (and may have exited since) ends the
        wait only where it is ``peer`` or one of ``partners``, those this rank still
        exchanges with in the step: one that closed after completing the call owes this
        rank nothing more (the others still finishing theirs must not fail), and one that
        closed without entering it fails the ranks that wait on it, whose failure reaches
        this rank."""
        try:
            self._check_peers(call, watched, {peer, *partners})
        except CclError:
            self.futex.fence()  # the peer wrote before it left: its writes are seen now
            if not ready():
                raise

    def _check_peers(
        self, call: wire.Call, watched: Collection[int] | None, partners: Collection[int]
    ) -> None:
        others = self.others if watched is None else [v for v in self.others if v.rank in watched]
        # a peer that closed cleanly matters only as a partner (see check_peers)
        others = [v for v in others if v.rank in partners or v.i[W_STATE] != STATE_CLOSED]
        for view in others:
            state = view.i[W_STATE]
            if state != STATE_OK:
                self._peer_failed(call, view, state)
        now = time.monotonic()
        if now - self._pids_checked < SLEEP_SLICE_S:
            return
        self._pids_checked = now
        fds = [v.pidfd for v in others if v.pidfd is not None]
        if fds:
            readable, _, _ = select.select(fds, [], [], 0)
            for view in others:
                if view.pidfd in readable:
                    self._peer_error(call, view.rank, f"rank {view.rank}'s process exited", GONE)

    def _peer_failed(self, call: wire.Call, view: View, state: int) -> None:
        if state == STATE_BROKEN:
            raw = view.read_revoke()
            try:
                rev = revocation.decode(raw) if raw else None
            except BadInput:
                rev = None
            if rev is not None:
                raise revoked(
                    f"rank {self.rank}: {call.what()} seq {call.seq}",
                    rev,
                    rank=self.rank,
                    peer=view.rank,
                    seq=call.seq,
                    op=call.op,
                )
        why = "closed its communicator" if state == STATE_CLOSED else "failed"
        self._peer_error(call, view.rank, f"rank {view.rank} {why}", why)

    def _peer_error(self, call: wire.Call, peer: int, text: str, why: str) -> None:
        raise link_broke(self.rank, peer, call, text, why)

    def announce(self, status: str, record: Revocation | None = None) -> None:
        """Set this rank's state word to ``status`` (``broken`` or ``closed``), once, after
        leaving ``record`` in the revoke area: the failure state's hook, so every peer's
        wait on this rank ends now and names the failure's origin."""
        me = self.me
        if me.i[W_STATE] == STATE_OK:
            if record is not None and status != "closed":
                me.write_revoke(record.encode())
                self.futex.fence()
            me.i[W_STATE] = STATE_CLOSED if status == "closed" else STATE_BROKEN
            self.notify()


def link_broke(rank: int, peer: int, call: wire.Call, text: str, why: str) -> PeerError:
    """The error of ``rank``'s call when its shared-memory link to ``peer`` broke: ``text``
    says how, ``why`` is the short reason a revocation carries."""
    return PeerError(
        f"rank {rank}: shared-memory link to rank {peer} broke in {call.describe()}: {text}",
        rank=rank,
        peer=peer,
        seq=call.seq,
        op=call.op,
        why=why,
        fault="peer_failed",
    )
