"""The collectives as they run: torch.distributed-style calls on numpy arrays, traced end to end.

Each call checks its buffers, takes what :mod:`~cclctl.runtime.comm.selection` decided for
its op and size, opens (:mod:`~cclctl.runtime.comm.calls`: a sequence number, the same on
every rank for the same call, and a trace record naming that algorithm), runs it
(:mod:`~cclctl.runtime.comm.dispatch`) and closes the record. The record is what telemetry
counts, what the flight recorder keeps and what diagnosis reads, so every rank can always
say which collective it is in and whom it waits on. One attempt each: what a failure then
does (raise, retry, shrink) is the recovery policy's (:mod:`cclctl.runtime.comm.recovery`),
which the :class:`~cclctl.runtime.comm.communicator.Communicator` runs each call through.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cclctl.config import RuntimeConfig
from cclctl.runtime.algorithms import zero_copy
from cclctl.runtime.algorithms.context import COPY, Scratch, as_bytes, finish_avg
from cclctl.runtime.comm import buffers, dispatch, prepared, selection
from cclctl.runtime.comm.calls import Calls
from cclctl.runtime.comm.ending import Ending, settle
from cclctl.runtime.comm.prepared import Gather, PreparedCalls, Scatter
from cclctl.runtime.comm.tracing import Tracer
from cclctl.runtime.failure import FailureState
from cclctl.runtime.identity import UNKNOWN, RankIdentity
from cclctl.runtime.transport.base import Transport
from cclctl.runtime.transport.shm import shared_buffers

Array = np.ndarray


class Collectives:
    """One attempt at each collective of a group of ranks, over its transport."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        transport: Transport,
        cfg: RuntimeConfig,
        comm_id: str,
        tracer: Tracer | None = None,
        watchdog: bool = False,
        members: Sequence[int] | None = None,
        identity: RankIdentity = UNKNOWN,
    ) -> None:
        """``watchdog``: a watchdog thread expires hung calls (through :attr:`failure`).
        ``members``: each rank's rank in the job (None: the same); ``identity``: where its
        failures point."""
        self.rank = rank
        self.world_size = world_size
        self.members = list(range(world_size) if members is None else members)
        self.id = comm_id
        self.cfg = cfg
        self._scratch = Scratch()
        self._use(transport)
        self._calls = Calls(
            rank=rank,
            world_size=world_size,
            comm_id=comm_id,
            transport=transport,
            cfg=cfg,
            scratch=self._scratch,
            watchdog=watchdog,
            members=() if members is None else members,
            identity=identity,
        )
        self._calls.tracer = tracer
        self._call = self._calls.open  # every call opens here: one bound method
        self._p2p_sent = [0] * world_size
        self._p2p_received = [0] * world_size

    def _use(self, transport: Transport) -> None:
        """Run calls over ``transport`` (at creation, and when a retry renewed it): what
        runs each op is decided again for the engines it offers, and plans made for the
        old one's memory are forgotten."""
        self.transport = transport
        self._caps = transport.capabilities
        self._choose = selection.decide(selection.parse(self.cfg.algo), self._caps, self.world_size)
        # Zero-copy calls' checks, for the same arrays again.
        self._plans: PreparedCalls[shared_buffers.CallDescriptors] = PreparedCalls()
        self._gathers: PreparedCalls[Gather] = PreparedCalls()
        self._scatters: PreparedCalls[Scatter] = PreparedCalls()
        if hasattr(self, "_calls"):
            self._calls.transport = transport

    def renew(self, transport: Transport) -> None:
        """Run the next calls over ``transport``, a retry's renewed links."""
        self._use(transport)

    @property
    def calls(self) -> Calls:
        """Where each call opens: its seq, its record, the failure state."""
        return self._calls

    @property
    def failure(self) -> FailureState:
        """Whether calls may run here and, once not, the first failure's origin."""
        return self._calls.failure

    @property
    def tracer(self) -> Tracer | None:
        """Telemetry that sees every call (None: calls are not recorded)."""
        return self._calls.tracer

    @tracer.setter
    def tracer(self, tracer: Tracer | None) -> None:
        self._calls.tracer = tracer

    # ----------------------------------------------------------------- one attempt each
    def all_reduce(self, buf: Array, op: str, out: Array | None, ending: Ending | None = None,
                   views: tuple[Array, Array] | None = None) -> Array:  # fmt: skip
        """``views``: ``buf``'s and ``out``'s flat views where the caller checked them and
        ``op`` already (a re-run checks once for all its attempts)."""
        if views is None:
            buffers.check_redop(op, "all_reduce")
        zc, src, dst = prepared.remembered(self._plans, "all_reduce", buf, out)
        if zc is None:
            src, dst = buffers.reduce_args(buf, out, "all_reduce") if views is None else views
            if src.nbytes >= self._choose.all_reduce.zero_copy_from:
                zc = shared_buffers.plan(src, dst)
                if zc is not None:
                    self._plans.keep("all_reduce", (buf, out), zc)
        if zc is not None:
            with self._call("all_reduce", src, zero_copy.ALGO, redop=op, shared=True) as step:
                group = dispatch.one_copy(step, self._caps)
                zero_copy.all_reduce(step, group, src, dst, op, zc)
                if op == "avg":
                    finish_avg(dst, self.world_size)
                if ending is not None:
                    ending(step)
            return dst if out is None else out
        algo = self._choose.all_reduce.pick(src.nbytes, src.size)
        with self._call("all_reduce", src, algo, redop=op) as step:
            dispatch.all_reduce(step, algo, self._caps, src, dst, op)
            if op == "avg":
                finish_avg(dst, self.world_size)
            if ending is not None:
                ending(step)
        return dst if out is None else out

    def all_gather(self, buf: Array, out: Array, ending: Ending | None = None) -> Array:
        prep = self._gathers.get("all_gather", buf, out)
        if prep is not None:
            src, dst = buf.reshape(-1), out.reshape(-1)
        else:
            src, dst, in_slot = buffers.gather_args(buf, out, self.world_size, self.rank)
            bounds = [(i * src.size, (i + 1) * src.size) for i in range(self.world_size)]
            prep = None
            if dst.nbytes >= self._choose.all_gather.zero_copy_from:
                prep = prepared.gather_plan(src, dst, bounds, self.rank, in_slot)
            if prep is None:
                algo = self._choose.all_gather.pick(dst.nbytes, dst.size)
                if not in_slot:
                    lo, hi = bounds[self.rank]
                    dst[lo:hi] = src
                with self._call("all_gather", src, algo, nbytes=dst.nbytes) as step:
                    settle(step, dst, ending)
                    if src.size:
                        dispatch.all_gather(step, algo, self._caps, dst, bounds)
                    if ending is not None:
                        ending(step)
                return out
            self._gathers.keep("all_gather", (buf, out), prep)
        if prep.staged:
            lo, hi = prep.bounds[self.rank]
            dst[lo:hi] = src
        copy_in = src if prep.copy_in else None
        with self._call("all_gather", src, zero_copy.ALGO, nbytes=dst.nbytes, shared=True) as step:
            group = dispatch.one_copy(step, self._caps)
            zero_copy.all_gather(step, group, dst, prep.bounds, prep.where, copy_in)
            if ending is not None:
                ending(step)
        return out

    def reduce_scatter(self, buf: Array, out: Array, op: str, ending: Ending | None = None
                        ) -> Array:  # fmt: skip
        buffers.check_redop(op, "reduce_scatter")
        prep = self._scatters.get("reduce_scatter", buf, out)
        if prep is not None:
            src, dst = buf.reshape(-1), out.reshape(-1)
            bounds, where = prep.bounds, prep.where
        else:
            src, dst = buffers.scatter_args(buf, out, self.world_size, self.rank)
            k = dst.size
            bounds = [(i * k, (i + 1) * k) for i in range(self.world_size)]
            where = None
            if src.nbytes >= self._choose.reduce_scatter.zero_copy_from:
                where = shared_buffers.plan(src)
                if where is not None:
                    self._scatters.keep("reduce_scatter", (buf, out), Scatter(where, bounds))
        if where is not None:
            algo = zero_copy.ALGO
        else:
            algo = self._choose.reduce_scatter.pick(src.nbytes, src.size)
        k = dst.size
        with self._call(
            "reduce_scatter", src, algo, redop=op, count=k, shared=where is not None
        ) as step:
            if where is not None:
                group = dispatch.one_copy(step, self._caps)
                zero_copy.reduce_scatter(step, group, src, dst, bounds, op, where)
            elif k:
                dispatch.reduce_scatter(step, algo, self._caps, src, dst, bounds, op)
            if k and op == "avg":
                finish_avg(dst, self.world_size)
            if ending is not None:
                ending(step)
        return out

    def broadcast(self, buf: Array, root: int, out: Array | None, ending: Ending | None = None
                   ) -> Array:  # fmt: skip
        root = buffers.check_root(root, self.world_size, "broadcast")
        zc, src, dst = prepared.remembered(self._plans, "broadcast", buf, out)
        if zc is None:
            src, dst = buffers.in_out(buf, out, "broadcast", writable=out is None)
            if dst.nbytes >= self._choose.broadcast.zero_copy_from:
                zc = shared_buffers.plan(dst)
                if zc is not None:
                    self._plans.keep("broadcast", (buf, out), zc)
        if self.rank == root and dst is not src:
            dst[...] = src
        if zc is not None:
            with self._call("broadcast", src, zero_copy.ALGO, root=root, shared=True) as step:
                group = dispatch.one_copy(step, self._caps)
                zero_copy.broadcast(step, group, dst, root, zc)
                if ending is not None:
                    ending(step)
            return dst if out is None else out
        algo = self._choose.broadcast.pick(src.nbytes, src.size)
        with self._call("broadcast", src, algo, root=root) as step:
            settle(step, dst, ending)
            dispatch.broadcast(step, algo, self._caps, dst, root)
            if ending is not None:
                ending(step)
        return dst if out is None else out

    def reduce(self, buf: Array, op: str, root: int, out: Array | None) -> Array:
        src, dst = buffers.in_out(buf, out, "reduce", writable=out is None and self.rank == root)
        buffers.check_redop(op, "reduce")
        root = buffers.check_root(root, self.world_size, "reduce")
        algo = self._choose.reduce.pick(src.nbytes, src.size)
        with self._call("reduce", src, algo, redop=op, root=root) as step:
            dispatch.reduce(step, algo, self._caps, src, dst, op, root)
            if op == "avg" and self.rank == root:
                finish_avg(dst, self.world_size)
        return dst if out is None else out

    def all_to_all(self, buf: Array, out: Array) -> Array:
        src, dst = buffers.all_to_all_args(buf, out, self.world_size)
        algo = self._choose.all_to_all.pick(src.nbytes, src.size)
        with self._call("all_to_all", src, algo) as step:
            if src.size:
                src = self._apart(src, dst)
                dispatch.all_to_all(step, algo, self._caps, src, dst, src.size // self.world_size)
        return out

    def all_to_allv(self, buf: Array, out: Array, send_counts: Sequence[int],
                    recv_counts: Sequence[int]) -> Array:  # fmt: skip
        src, dst, sends, recvs = buffers.all_to_allv_args(
            buf, out, send_counts, recv_counts, self.world_size, self.rank
        )
        algo = self._choose.all_to_allv.alike()  # the same on every rank, whatever its sizes
        with self._call("all_to_allv", src, algo) as step:
            dispatch.all_to_allv(step, algo, self._caps, self._apart(src, dst), dst, sends, recvs)
        return out

    def _apart(self, src: Array, dst: Array) -> Array:
        """``src``, or a copy of it where it overlaps ``dst`` (an in-place all_to_all)."""
        if not buffers.overlaps(src, dst):
            return src
        copy = self._scratch.get(COPY, src.size, src.dtype)
        copy[...] = src
        return copy

    def send(self, buf: Array, dst: int) -> None:
        src = buffers.flat(buf, "buf", "send")
        peer = buffers.check_peer(dst, self.rank, self.world_size, "send")
        self._p2p_sent[peer] += 1
        with self._call("send", src, "direct", peer=peer, seq=self._p2p_sent[peer]) as step:
            step.xfer(0, sends=[(peer, as_bytes(src))])

    def recv(self, buf: Array, src: int) -> Array:
        dst = buffers.flat(buf, "buf", "recv", writable=True)
        peer = buffers.check_peer(src, self.rank, self.world_size, "recv")
        self._p2p_received[peer] += 1
        with self._call("recv", dst, "direct", peer=peer, seq=self._p2p_received[peer]) as step:
            step.xfer(0, recvs=[(peer, as_bytes(dst))])
        return buf

    def barrier(self) -> None:
        token = np.zeros(1, dtype=np.uint8)
        algo = self._choose.barrier.small
        with self._call("barrier", token, algo, redop="max", nbytes=0) as step:
            dispatch.all_reduce(step, algo, self._caps, token, token, "max")
