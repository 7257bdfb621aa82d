"""The ranks of one host and their mapped segments, and the one-copy engine's rounds.

A one-copy collective runs in rounds. In round ``k`` every rank publishes its input (a
chunk of it) in slot ``k % slots`` of its own segment, under the call's wire header; peers
read it in place once their header check passes, then say they are done with it. With
several slots a fast rank runs ahead while a slow one still reads; a slot is reused only
once every peer has finished with it. The reduce-scatter + all-gather all-reduce adds a
second set of slots for each rank's reduced share. Algorithms use only the methods below;
the counters and offsets behind them stay here (see ``layout.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cclctl.runtime.transport import wire
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.shm.cross_memory import CrossMemory
from cclctl.runtime.transport.shm.futex import Futex
from cclctl.runtime.transport.shm.host_peers import HostPeers
from cclctl.runtime.transport.shm.layout import (
    HEADER,
    Q_COLL_PUB,
    Q_COLL_USED,
    Q_RES_PUB,
    Q_RES_USED,
    Layout,
    View,
)
from cclctl.runtime.transport.shm.shared_buffers import PeerBuffers

_CACHED_VIEW_BYTES = 64 << 10
_CACHED_VIEWS = 512


class Round:
    """One round of a one-copy collective: its number, its slot, the header it carries."""

    __slots__ = ("call", "header", "k", "nbytes", "offset", "step", "wait")

    def __init__(self, k: int, offset: int, call: wire.Call, wait: Wait, step: int, nbytes: int):
        self.k = k
        self.offset = offset  # of the slot (its header) in every rank's segment
        self.call = call
        self.wait = wait
        self.step = step
        self.nbytes = nbytes  # of the payload every rank publishes in this round
        self.header = wire.pack(call, step, nbytes)


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
        self.ranks = list(ranks)  # global rank of each local index, ascending
        self.size = len(self.ranks)
        #: waits on, wake-ups of and the liveness of the host's ranks
        self.peers = HostPeers(
            rank, views, self.ranks.index(rank), spin_s=spin_s, yield_s=yield_s, futex=futex
        )
        self.rank = rank
        self.views = self.peers.views  # by local index
        self.local = self.peers.local
        self.me = self.peers.me
        self.others = self.peers.others
        self.layout = layout
        self.round = 0  # collective rounds this rank has taken part in
        self.last_res_round = -1  # the latest round that used the result slots
        self._arrays: dict[tuple[int, int, int, np.dtype], np.ndarray] = {}
        self.peer_buffers = PeerBuffers()  # peers' shared buffers (zero-copy collectives)
        #: peers' private memory through the kernel, where every rank of the host may
        #: reach every other's (set by open_group; single-copy collectives)
        self.cross_memory: CrossMemory | None = None
        # Bytes moved to and from each rank (by global rank), set by the owning transport.
        self.sent: list[int] = [0] * (max(self.ranks) + 1)
        self.received: list[int] = [0] * (max(self.ranks) + 1)

    # ------------------------------------------------------------------ rounds
    def next_round(self, call: wire.Call, wait: Wait, step: int, nbytes: int) -> Round:
        """Take the next round without publishing in it (readers of a broadcast root)."""
        k = self.round
        self.round = k + 1
        return Round(k, self.layout.coll_slot(k), call, wait, step, nbytes)

    def claim_round(self, call: wire.Call, wait: Wait, step: int, nbytes: int) -> Round:
        """Take the next round once every peer has finished reading the last one that used
        its slot, so this rank may write there."""
        rnd = self.next_round(call, wait, step, nbytes)
        self._await_all(Q_COLL_USED, rnd.k - self.layout.slots + 1, rnd)
        return rnd

    def publish(self, rnd: Round, src: np.ndarray, skip: tuple[int, int] = (0, 0)) -> None:
        """Copy ``src`` (1-d, or a strided 2-d piece) under ``rnd``'s header into this
        rank's slot, and tell the peers; a 1-d ``src``'s elements ``skip`` = ``[a, b)``
        stay out (a share no peer reads)."""
        me, off = self.me, rnd.offset
        me.mv[off : off + wire.HEADER_SIZE] = rnd.header
        if src.nbytes:
            slot = self.slot_array(me, off + HEADER, src.nbytes, src.dtype)
            if src.ndim == 1:
                a, b = skip
                if b > a:
                    slot[:a] = src[:a]
                    slot[b:] = src[b:]
                else:
                    slot[...] = src
            else:  # reduce_scatter's round: one strided piece of every block
                slot.reshape(src.shape)[...] = src
        me.q[Q_COLL_PUB] = rnd.k + 1
        self.peers.notify()

    def publish_bytes(self, rnd: Round, payload: bytes) -> None:
        """Put ``payload`` under ``rnd``'s header in this rank's slot, and tell the peers."""
        mv, off = self.me.mv, rnd.offset
        mv[off : off + wire.HEADER_SIZE] = rnd.header
        mv[off + HEADER : off + HEADER + len(payload)] = payload
        self.me.q[Q_COLL_PUB] = rnd.k + 1
        self.peers.notify()

    def await_input(self, view: View, rnd: Round) -> None:
        """Return once ``view`` has published ``rnd`` and its header is the one expected."""
        if view.q[Q_COLL_PUB] <= rnd.k:
            self.peers.wait_counter(view, Q_COLL_PUB, rnd.k + 1, rnd.call, rnd.wait, "recv")
        self.check_header(view, rnd.offset, rnd.header, rnd.call, rnd.step, rnd.nbytes)

    def input_array(self, view: View, rnd: Round, dtype: np.dtype) -> np.ndarray:
        """``view``'s input of ``rnd`` as ``dtype``, in place (this rank's own at once)."""
        if view is not self.me:
            self.await_input(view, rnd)
        return self.slot_array(view, rnd.offset + HEADER, rnd.nbytes, dtype)

    def input_bytes(self, view: View, rnd: Round) -> memoryview:
        """``view``'s payload of ``rnd`` as bytes, once published and checked."""
        self.await_input(view, rnd)
        base = rnd.offset + HEADER
        return view.mv[base : base + rnd.nbytes]

    def inputs_read(self, rnd: Round, notify: bool = True) -> None:
        """Say this rank has finished reading every peer's input of ``rnd``."""
        self.me.q[Q_COLL_USED] = rnd.k + 1
        if notify:
            self.peers.notify()

    def await_read(self, view: View, rnd: Round) -> None:
        """Return once ``view`` has finished reading this rank's input of ``rnd``."""
        if view.q[Q_COLL_USED] <= rnd.k:
            self.peers.wait_counter(view, Q_COLL_USED, rnd.k + 1, rnd.call, rnd.wait, "send")

    # ------------------------------------------------------------------ result slots
    def result_array(self, rnd: Round, a: int, b: int, dtype: np.dtype) -> np.ndarray:
        """Elements ``[a, b)`` of this rank's result slot for ``rnd``, once every peer has
        finished reading the last round that used it."""
        need = min(rnd.k - self.layout.slots + 1, self.last_res_round + 1)
        self._await_all(Q_RES_USED, need, rnd)
        self.last_res_round = rnd.k
        isz = dtype.itemsize
        return self.slot_array(
            self.me, self.layout.res_slot(rnd.k) + HEADER + a * isz, (b - a) * isz, dtype
        )

    def publish_result(self, rnd: Round) -> None:
        """Say this rank's result of ``rnd`` is complete (in its slot or in peers' buffers)."""
        self.me.q[Q_RES_PUB] = rnd.k + 1
        self.peers.notify()

    def await_result(self, view: View, rnd: Round) -> None:
        """Return once ``view`` has published its result of ``rnd``."""
        if view.q[Q_RES_PUB] <= rnd.k:
            self.peers.wait_counter(view, Q_RES_PUB, rnd.k + 1, rnd.call, rnd.wait, "recv")

    def peer_result(self, view: View, rnd: Round, a: int, b: int, dtype: np.dtype) -> np.ndarray:
        """Elements ``[a, b)`` of ``view``'s result slot for ``rnd``, once published."""
        self.await_result(view, rnd)
        isz = dtype.itemsize
        off = self.layout.res_slot(rnd.k) + HEADER + a * isz
        return self.slot_array(view, off, (b - a) * isz, dtype)

    def results_read(self, rnd: Round) -> None:
        """Say this rank has finished reading every peer's result of ``rnd``."""
        self.me.q[Q_RES_USED] = rnd.k + 1
        self.peers.notify()

    def account(self, nbytes: int) -> None:
        """Count ``nbytes`` each way with every peer (one-copy rounds are symmetric: what
        this rank reads from a peer's slot, that peer reads from this rank's)."""
        sent, received = self.sent, self.received
        for view in self.others:
            sent[view.rank] += nbytes
            received[view.rank] += nbytes

    def _await_all(self, counter: int, need: int, rnd: Round) -> None:
        if need <= 0:
            return
        for view in self.others:
            if view.q[counter] < need:
                self.peers.wait_counter(view, counter, need, rnd.call, rnd.wait, "recv")

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
        header = wire.unpack(bytes(got), view.rank)
        wire.check(header, call, step, nbytes, self.rank, view.rank)
        raise AssertionError("a header that differs must fail its check")  # pragma: no cover

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self.peers.announce("closed")  # a group closed without its communicator's state (setup)
        self._arrays.clear()
        self.peer_buffers.close()
        for view in self.views:
            view.release()
