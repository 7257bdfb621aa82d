"""The ranks of one host and their mapped segments: publish, wait, check, fail fast.

A wait first looks once (most small-message waits end there), then spins briefly, then
yields the core for up to a millisecond, then sleeps on this rank's futex word. Peers bump
that word after they publish, but only when they see this rank's ``sleeping`` flag, so a
run where every rank has its own core makes no system call at all, while one with more
ranks than cores hands the core to the awaited rank instead of burning it. Every sleep is
bounded, so a dead peer (its pidfd turns readable), a peer that failed (its ``state``
word), the deadline and an abort are all seen within one slice.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable, Sequence

import numpy as np

from cclctl.errors import PeerError
from cclctl.runtime.comm.shared_buffers import PeerBuffers
from cclctl.runtime.transport import wire
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
    Layout,
    View,
)

_CACHED_VIEW_BYTES = 64 << 10
_CACHED_VIEWS = 512
SLEEP_SLICE_S = 0.02  # the longest a sleeper goes without re-checking liveness and deadline


class ShmGroup:
    """This rank's view of every segment on its host (``views`` by local index)."""

    def __init__(
        self,
        rank: int,
        ranks: Sequence[int],
        views: Sequence[View],
        layout: Layout,
        *,
        spin_s: float,
        yield_s: float,
        futex: Futex,
    ) -> None:
        self.rank = rank
        self.ranks = list(ranks)  # global rank of each local index, ascending
        self.local = self.ranks.index(rank)
        self.size = len(self.ranks)
        self.views = list(views)
        self.me = self.views[self.local]
        self.others = [v for v in self.views if v is not self.me]
        self.layout = layout
        self.spin_s = spin_s  # the longest busy spin
        self.spin = spin_s  # the current one (see wait_counter)
        self.yield_s = yield_s
        self.futex = futex
        self.round = 0  # collective rounds this rank has taken part in
        self.last_res_round = -1  # the latest round that used the result slots
        self._pids_checked = time.monotonic()
        self._arrays: dict[tuple[int, int, int, np.dtype], np.ndarray] = {}
        self.peer_buffers = PeerBuffers()  # peers' shared buffers (zero-copy collectives)
        # Bytes moved to and from each rank (by global rank), set by the owning transport.
        self.sent: list[int] = [0] * (max(self.ranks) + 1)
        self.received: list[int] = [0] * (max(self.ranks) + 1)

    # ------------------------------------------------------------------ signalling
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
        now = time.perf_counter()
        busy, polite = now + self.spin, now + self.spin + self.yield_s
        while True:  # spin: the peer is usually running on another core right now
            if q[index] >= target:
                self.spin = min(self.spin_s, 2 * self.spin + 1e-6)
                return
            now = time.perf_counter()
            if now >= busy:
                break
        self.spin *= 0.5
        while now < polite:  # yield: or it waits for the core this rank is holding
            os.sched_yield()
            if q[index] >= target:
                return
            now = time.perf_counter()
        self.block(lambda: q[index] >= target, view.rank, what, call, wait)

    def block(
        self, ready: Callable[[], bool], peer: int, what: str, call: wire.Call, wait: Wait
    ) -> None:
        """Sleep until ``ready()``; ``peer`` is whom the trace says this rank waits on."""
        wait.blocked_on(peer, what)
        me = self.me.i
        try:
            while True:
                seen = me[W_WAKE]
                me[W_SLEEPING] = 1
                self.futex.fence()
                if ready():
                    return
                wait.check(call, peer, what)
                self.check_peers(call, peer)
                self.futex.wait(self.me.wake_addr, seen, SLEEP_SLICE_S)
        finally:
            me[W_SLEEPING] = 0

    def check_peers(self, call: wire.Call, peer: int) -> None:
        """Raise if the awaited peer, or any peer, failed, closed or died."""
        for view in self.others:
            state = view.i[W_STATE]
            if state != STATE_OK:
                why = "closed its communicator" if state == STATE_CLOSED else "failed"
                self._peer_error(call, view.rank, f"rank {view.rank} {why}")
        now = time.monotonic()
        if now - self._pids_checked < SLEEP_SLICE_S:
            return
        self._pids_checked = now
        fds = [v.pidfd for v in self.others if v.pidfd is not None]
        if fds:
            readable, _, _ = select.select(fds, [], [], 0)
            for view in self.others:
                if view.pidfd in readable:
                    self._peer_error(call, view.rank, f"rank {view.rank}'s process exited")

    def _peer_error(self, call: wire.Call, peer: int, why: str) -> None:
        self.fail()
        raise PeerError(
            f"rank {self.rank}: shared-memory link to rank {peer} broke in "
            f"{call.describe()}: {why}",
            rank=self.rank,
            peer=peer,
            seq=call.seq,
            op=call.op,
        )

    # ------------------------------------------------------------------ data
    def slot_array(self, view: View, offset: int, nbytes: int, dtype: np.dtype) -> np.ndarray:
        """``nbytes`` of ``view`` at ``offset`` as a ``dtype`` array; small ones are cached,
        since making a numpy view costs about as much as moving a few kilobytes.
        """
        if nbytes > _CACHED_VIEW_BYTES:
            return view.u8[offset : offset + nbytes].view(dtype)
        key = (view.rank, offset, nbytes, dtype)
        arr = self._arrays.get(key)
        if arr is None:
            if len(self._arrays) >= _CACHED_VIEWS:
                self._arrays.clear()
            arr = self._arrays[key] = view.u8[offset : offset + nbytes].view(dtype)
        return arr

    # ------------------------------------------------------------------ headers
    def write_header(self, offset: int, header: bytes) -> None:
        self.me.mv[offset : offset + wire.HEADER_SIZE] = header

    def check_header(
        self,
        view: View,
        offset: int,
        expected: bytes,
        call: wire.Call,
        step: int,
        nbytes: int,
    ) -> None:
        got = view.mv[offset : offset + wire.HEADER_SIZE]
        if got == expected:
            return
        self.fail()
        header = wire.unpack(bytes(got), view.rank)
        wire.check(header, call, step, nbytes, self.rank, view.rank)
        raise AssertionError("a header that differs must fail its check")  # pragma: no cover

    # ------------------------------------------------------------------ lifecycle
    def fail(self) -> None:
        """Tell every peer this rank's link state is unusable, so their waits end now."""
        if self.me.i[W_STATE] == STATE_OK:
            self.me.i[W_STATE] = STATE_BROKEN
            self.notify()

    def close(self) -> None:
        if self.me.i[W_STATE] == STATE_OK:
            self.me.i[W_STATE] = STATE_CLOSED
            self.notify()
        self._arrays.clear()
        self.peer_buffers.close()
        for view in self.views:
            view.release()
