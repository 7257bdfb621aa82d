"""The communicator: torch.distributed-style collectives on numpy arrays, traced end to end.

Each call checks its buffers, opens (:mod:`~cclctl.runtime.comm.calls`: a sequence number, the
same on every rank for the same call, and a trace record), runs the algorithm chosen for its
size and closes the record. The record is what telemetry counts, what the flight recorder
keeps and what diagnosis reads, so every rank can always say which collective it is in and
whom it waits on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from cclctl.config import RuntimeConfig
from cclctl.runtime.algorithms import latency, pairwise, pipeline, ring, zero_copy
from cclctl.runtime.algorithms.context import Scratch, as_bytes, chunk_bounds, finish_avg
from cclctl.runtime.comm import buffers, selection, shared_buffers
from cclctl.runtime.comm.calls import Calls
from cclctl.runtime.comm.failure import FailureState
from cclctl.runtime.comm.prepared import PreparedCalls
from cclctl.runtime.comm.tracing import Tracer
from cclctl.runtime.transport.base import Transport

Array = np.ndarray


def world_comm_id(world_size: int) -> str:
    """The world communicator's id: creation index 0 and its member ranks."""
    return f"0:0-{world_size - 1}" if world_size > 1 else "0:0"


class Communicator:
    """A group of ranks that run collectives together."""

    backend = "cclctl"

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        transport: Transport,
        cfg: RuntimeConfig,
        comm_id: str,
        tracer: Tracer | None = None,
        on_close: Callable[[], None] | None = None,
        watchdog: bool = False,
    ) -> None:
        """``watchdog``: whether a watchdog thread expires this communicator's hung calls
        (through :attr:`failure`; see :class:`~cclctl.runtime.comm.calls.Calls`).
        """
        self.rank = rank
        self.world_size = world_size
        self.id = comm_id
        self.cfg = cfg
        self.transport = transport
        self._selection = selection.parse(cfg.algo)
        self._scratch = Scratch()
        self._prepared = PreparedCalls()  # zero-copy calls' checks, for the same arrays again
        self._calls = Calls(
            rank=rank,
            world_size=world_size,
            comm_id=comm_id,
            transport=transport,
            cfg=cfg,
            scratch=self._scratch,
            watchdog=watchdog,
        )
        self._calls.tracer = tracer
        self._call = self._calls.open  # every call opens here: one bound method
        self._p2p_sent = [0] * world_size
        self._p2p_received = [0] * world_size
        self._on_close = on_close

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

    # ----------------------------------------------------------------- buffers
    def empty(self, shape: Any, dtype: Any = np.float32) -> Array:
        """A new, uninitialised array that ranks on this host read directly.

        Collectives whose buffers come from here on every rank of a one-host communicator
        run zero-copy (nothing is staged through shared-memory slots): about 2-3x the
        bandwidth from a few MiB up. Pass such buffers on every rank or on none: a mix is a
        collective mismatch. Allocate them once and reuse them (e.g. as staging buffers);
        each lives as long as any array that views it.
        """
        return shared_buffers.empty(shape, dtype)

    def zeros(self, shape: Any, dtype: Any = np.float32) -> Array:
        """As :meth:`empty`, zeroed (free: new shared memory starts zero-filled)."""
        return shared_buffers.zeros(shape, dtype)

    def _zero_copy(self, nbytes: int, *arrays: Array) -> zero_copy.Plan | None:
        return zero_copy.plan(self.transport, self.world_size, nbytes, arrays)

    def _remembered(
        self, op: str, buf: Array, out: Array | None
    ) -> tuple[zero_copy.Plan | None, Array, Array]:
        """The plan of a recent zero-copy ``op`` on these very arrays, with their flat views
        (unchecked: the arrays passed every check then); ``(None, buf, buf)`` if none."""
        zc = self._prepared.get(op, buf, out)
        if zc is None:
            return None, buf, buf
        src = buf.reshape(-1)
        return zc, src, src if out is None else out.reshape(-1)

    # ----------------------------------------------------------------- collectives
    def all_reduce(self, buf: Array, op: str = "sum", out: Array | None = None) -> Array:
        buffers.check_redop(op, "all_reduce")
        zc, src, dst = self._remembered("all_reduce", buf, out)
        if zc is None:
            src, dst = buffers.reduce_args(buf, out, "all_reduce")
            zc = self._zero_copy(src.nbytes, src, dst)
            if zc is not None:
                self._prepared.keep("all_reduce", (buf, out), zc)
        if zc is not None:
            with self._call("all_reduce", src, zero_copy.ALGO, redop=op, shared=True) as step:
                zero_copy.all_reduce(step, zc[0], src, dst, op, zc[1])
                if op == "avg":
                    finish_avg(dst, self.world_size)
            return dst if out is None else out
        algo = self._selection.choose("all_reduce", src.nbytes)
        with self._call("all_reduce", src, algo, redop=op) as step:
            if self.world_size == 1 or src.size < self.world_size or algo == "rd":
                if dst is not src:
                    dst[...] = src
                if src.size:
                    latency.all_reduce(step, dst, op)
            else:
                ring.all_reduce(step, src, dst, op, chunk_bounds(src.size, self.world_size))
            if op == "avg":
                finish_avg(dst, self.world_size)
        return dst if out is None else out

    def all_gather(self, buf: Array, out: Array) -> Array:
        n = self.world_size
        prepared = self._prepared.get("all_gather", buf, out)
        if prepared is not None:
            zc, bounds, copy_in, staged = prepared
            src, dst = buf.reshape(-1), out.reshape(-1)
        else:
            src, dst, in_slot = buffers.gather_args(buf, out, n, self.rank)
            bounds = [(i * src.size, (i + 1) * src.size) for i in range(n)]
            # Zero-copy: peers read this rank's block from a shared ``buf`` while this rank
            # copies it into ``out`` (the two copies overlap), else from its slot of ``out``.
            zc = None if in_slot else self._zero_copy(dst.nbytes, src)
            copy_in = zc is not None
            staged = not in_slot and not copy_in  # buf goes to its slot of out first
            if zc is None:
                zc = self._zero_copy(dst.nbytes, dst[bounds[self.rank][0] : bounds[self.rank][1]])
            if zc is not None:
                self._prepared.keep("all_gather", (buf, out), (zc, bounds, copy_in, staged))
        if staged:
            lo, hi = bounds[self.rank]
            dst[lo:hi] = src
        if zc is not None:
            with self._call(
                "all_gather", src, zero_copy.ALGO, nbytes=dst.nbytes, shared=True
            ) as step:
                zero_copy.all_gather(step, zc[0], dst, bounds, zc[1][0], src if copy_in else None)
            return out
        with self._call("all_gather", src, "ring", nbytes=dst.nbytes) as step:
            if src.size:
                ring.all_gather(step, dst, bounds)
        return out

    def reduce_scatter(self, buf: Array, out: Array, op: str = "sum") -> Array:
        n = self.world_size
        buffers.check_redop(op, "reduce_scatter")
        prepared = self._prepared.get("reduce_scatter", buf, out)
        if prepared is not None:
            zc, bounds = prepared
            return self._reduce_scatter(buf.reshape(-1), out.reshape(-1), op, zc, bounds, out)
        src, dst = buffers.scatter_args(buf, out, n, self.rank)
        k = dst.size
        bounds = [(i * k, (i + 1) * k) for i in range(n)]
        zc = self._zero_copy(src.nbytes, src)
        if zc is not None:
            self._prepared.keep("reduce_scatter", (buf, out), (zc, bounds))
        return self._reduce_scatter(src, dst, op, zc, bounds, out)

    def _reduce_scatter(
        self,
        src: Array,
        dst: Array,
        op: str,
        zc: zero_copy.Plan | None,
        bounds: list[tuple[int, int]],
        out: Array,
    ) -> Array:
        n, k = self.world_size, dst.size
        algo = "ring" if zc is None else zero_copy.ALGO
        with self._call(
            "reduce_scatter", src, algo, redop=op, count=k, shared=zc is not None
        ) as step:
            if zc is not None:
                zero_copy.reduce_scatter(step, zc[0], src, dst, bounds, op, zc[1][0])
            elif k:
                ring.reduce_scatter(step, src, dst, bounds, op)
            if k and op == "avg":
                finish_avg(dst, n)
        return out

    def broadcast(self, buf: Array, root: int = 0, out: Array | None = None) -> Array:
        root = buffers.check_root(root, self.world_size, "broadcast")
        zc, src, dst = self._remembered("broadcast", buf, out)
        if zc is None:
            src, dst = buffers.in_out(buf, out, "broadcast", writable=out is None)
            zc = self._zero_copy(dst.nbytes, dst)
            if zc is not None:
                self._prepared.keep("broadcast", (buf, out), zc)
        if self.rank == root and dst is not src:
            dst[...] = src
        if zc is not None:
            with self._call("broadcast", src, zero_copy.ALGO, root=root, shared=True) as step:
                zero_copy.broadcast(step, zc[0], dst, root, zc[1][0])
            return dst if out is None else out
        algo = self._selection.choose("broadcast", src.nbytes)
        with self._call("broadcast", src, algo, root=root) as step:
            if algo == "chain":
                pipeline.broadcast(step, dst, root)
            elif src.size:
                latency.broadcast(step, dst, root)
        return dst if out is None else out

    def reduce(self, buf: Array, op: str = "sum", root: int = 0, out: Array | None = None) -> Array:
        src, dst = buffers.in_out(buf, out, "reduce", writable=out is None and self.rank == root)
        buffers.check_redop(op, "reduce")
        root = buffers.check_root(root, self.world_size, "reduce")
        algo = self._selection.choose("reduce", src.nbytes)
        if src.size < self.world_size:
            algo = "tree"
        with self._call("reduce", src, algo, redop=op, root=root) as step:
            if algo == "ring":
                bounds = chunk_bounds(src.size, self.world_size)
                lo, hi = bounds[self.rank]
                mine = self._scratch.get(5, hi - lo, src.dtype)
                steps = ring.reduce_scatter(step, src, mine, bounds, op)
                pairwise.gather_chunks(step, mine, dst, bounds, root, steps)
            elif src.size:
                acc = self._scratch.get(4, src.size, src.dtype)
                acc[...] = src
                latency.reduce(step, acc, op, root)
                if self.rank == root:
                    dst[...] = acc
            if op == "avg" and self.rank == root:
                finish_avg(dst, self.world_size)
        return dst if out is None else out

    def all_to_all(self, buf: Array, out: Array) -> Array:
        n = self.world_size
        src = buffers.flat(buf, "buf", "all_to_all")
        if src.size % n:
            raise buffers.InvalidArgument(
                f"all_to_all: buf has {src.size} elements, not a multiple of the world size {n}",
                op="all_to_all",
            )
        dst = buffers.matching_out(out, src, src.size, "all_to_all")
        with self._call("all_to_all", src, "pairwise") as step:
            if buffers.overlaps(src, dst):
                copy = self._scratch.get(4, src.size, src.dtype)
                copy[...] = src
                src = copy
            if src.size:
                pairwise.all_to_all(step, src, dst, src.size // n)
        return out

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
        with self._call("barrier", token, "rd", redop="max", nbytes=0) as step:
            latency.all_reduce(step, token, "max")

    # ----------------------------------------------------------------- lifecycle
    def abort(self, reason: str) -> None:
        """Make every blocked or future call on this communicator fail with ``reason``."""
        self._calls.failure.abort(reason)

    def close(self) -> None:
        """Refuse every later call, tell the peers and close the links (idempotent)."""
        if not self._calls.failure.close():
            return
        self.transport.close()
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Communicator {self.id} rank {self.rank}/{self.world_size} {self.transport.name}>"
