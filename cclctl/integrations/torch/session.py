"""One instrumented torch.distributed process: its telemetry and its process groups.

A session starts when the default process group exists (``init_process_group`` returned) and
ends with ``destroy_process_group()`` or at exit. Its per-process services are the rank's
agent's (:mod:`cclctl.runtime.agent`), shared with ``cclctl.init()`` in the same process:
counters and flight recorder (:class:`Telemetry`), the watchdog, the exporter and, when the
job's store can be found, the status publisher, job-wide dump requests (see
:mod:`cclctl.integrations.torch.store`) and the revoke end. The session registers its
process groups and the watchdog's hooks for their calls with the agent.

Every process group is a communicator: id ``<group name>:<folded member ranks>`` (torch
names groups by creation order, the same on every rank, so ``0:0-7`` is the world of 8 as in
the runtime), its own collective seq from 1 and a per-pair seq for point-to-point calls.

Calls arrive from the wrapper process groups (:mod:`~cclctl.integrations.torch.traced`),
on whichever thread issued them (the caller's, DDP's autograd threads); a record's seq is
given under ``_seq_lock``. Records are counted by the session's fold thread
(:mod:`~cclctl.integrations.torch.folding`) and by every reader.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from cclctl.config import RuntimeConfig
from cclctl.integrations.torch import ending
from cclctl.integrations.torch.calls import Call
from cclctl.integrations.torch.folding import FOLD_BACKSTOP, Folder
from cclctl.integrations.torch.records import TorchComm, dtype_info, error_text, finish_record
from cclctl.integrations.torch.revoke import TorchRevoke
from cclctl.integrations.torch.store import StoreAttachment, attach
from cclctl.integrations.torch.timing import Completions
from cclctl.records import STARTED, CollectiveRecord
from cclctl.runtime.agent import FailureHooks, for_process
from cclctl.runtime.job.revoke_end import open_end

log = logging.getLogger("cclctl.torch")


def quietly(fn: Callable[..., object], *args: Any) -> None:
    """``fn(*args)``, logging what it raises: telemetry must never change what the job sees."""
    try:
        fn(*args)
    except Exception:
        log.exception("cclctl: torch telemetry failed")


def hang_outcome(policy: str, backend: str) -> str:
    """What follows a hang the watchdog expired, in words for its log line: cclctl cannot
    raise into a thread blocked in gloo or NCCL, and gloo's abort does not unblock it."""
    if policy == "abort":
        if backend == "gloo":
            return "aborting the process group (gloo's call stays blocked until torch's timeout)"
        return "aborting the process group"
    return "the call stays blocked until torch's own timeout (cclctl cannot raise into it)"


class Session:
    """Telemetry of one process of an instrumented torch.distributed job."""

    def __init__(self, cfg: RuntimeConfig, dist: Any, world: Any) -> None:
        self.cfg = cfg
        self._dist = dist
        self.world = world
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.agent = for_process(cfg, self.rank, self.world_size, backend=str(dist.get_backend()))
        self.telemetry = self.agent.telemetry
        self.completions = Completions(self.close_record)
        #: known process groups, by group object
        self.comms: dict[Any, TorchComm] = {}
        self._seq_lock = threading.Lock()
        self._lock = threading.Lock()
        self.store: StoreAttachment | None = None
        self.folder: Folder | None = None
        self.revoke: TorchRevoke | None = None
        self._closed = False
        self._pid = os.getpid()
        self._undo_dumps: list[Callable[[], None]] = []

    def start(self) -> Session:
        """Start the background parts; a failure here is logged, never raised to the job."""
        tel = self.telemetry
        self.comm(self.world)
        # with no setup, into the job's folder (unless cclctl.init() installed its own)
        self._undo_dumps = self.agent.install_dumps(lambda: ending.install(tel, self._namer))
        try:
            self.store = attach(self.agent, self.cfg, self.rank, self.world_size)
        except Exception as exc:
            log.warning("cclctl: no live status for this job: %s", exc)
        if self.store is not None:
            tel.local_rank = self.store.local_rank
            self.revoke = self._revoker(self.store)
        try:
            self.agent.serve_metrics()
        except Exception as exc:
            log.warning("cclctl: no metrics endpoint: %s", exc)
        self.agent.watch(outcome=hang_outcome(self.cfg.on_hang, str(self._dist.get_backend())))
        self.folder = Folder(self).start()
        return self

    def _namer(self) -> TorchRevoke | None:
        return self.revoke

    def _revoker(self, store: StoreAttachment) -> TorchRevoke | None:
        """The torch front end of the agent's revoke end (made here unless ``cclctl.init()``
        made it first: one end per rank process)."""
        rdzv = store.rdzv
        try:
            end = open_end(
                self.agent.revoke_end, rdzv.store.address, rdzv.token, rdzv.job, self.telemetry
            )
        except Exception as exc:
            log.warning("cclctl: this rank does not share the job's revoke record: %s", exc)
            return None
        return TorchRevoke(end, self.telemetry, tuple(zip(rdzv.hosts, rdzv.pids, strict=False)))

    # -- process groups -------------------------------------------------------------------

    def comm(self, group: Any) -> TorchComm | None:
        """The communicator of ``group`` (None: the default group); None when this process
        is not a member or ``group`` is not a process group.
        """
        key = self.world if group is None else group
        comm = self.comms.get(key)
        if comm is not None:
            return comm
        try:
            ranks = list(self._dist.get_process_group_ranks(key))
            name = str(key.group_name)
        except Exception:
            return None
        if self.rank not in ranks:
            return None
        with self._lock:
            comm = self.comms.setdefault(key, TorchComm(key, name, ranks))
        self.agent.register(comm.id, ranks, FailureHooks(self._expired, self._abort))
        return comm

    def forget(self, group: Any) -> None:
        """``destroy_process_group(group)``: its counters stay, the group object goes."""
        self.telemetry.fold()
        with self._lock:
            self.comms.pop(group, None)

    # -- records --------------------------------------------------------------------------

    def open_record(self, comm: TorchComm, call: Call) -> CollectiveRecord:
        """Number the call, start its record and put it in flight."""
        tensor = call.tensor
        dtype = "" if tensor is None else dtype_info(tensor.dtype)[0]
        with self._seq_lock:
            peer = root = None
            if call.direction is not None:
                peer = comm.global_rank(None, call.group_peer)
                counts = comm.sent if call.direction == "send" else comm.received
                key = -1 if peer is None else peer  # recv from any source: its own sequence
                seq = counts[key] = counts.get(key, 0) + 1
                peer = key
            else:
                comm.seq += 1
                seq = comm.seq
                if call.group_root is not None:
                    root = comm.global_rank(None, call.group_root)
            # positional: cheaper than keywords, and this runs on the calling thread
            rec = CollectiveRecord(
                comm.id, seq, call.op, dtype, call.count, call.nbytes, root, peer, 0, "",
                STARTED, time.time_ns(),
            )  # fmt: skip
            rec.pg_name = comm.name
            if peer is not None and peer >= 0:
                rec.waiting_on, rec.waiting_for = peer, call.direction
            self.telemetry.start(rec)
        return rec

    def queued(self) -> int:
        """Records queued in telemetry, not yet counted (the folder folds while any are)."""
        return self.telemetry.queued()

    def fold(self) -> None:
        """Count every call made so far."""
        self.telemetry.fold()

    def close_record(self, rec: CollectiveRecord, error: BaseException | None, end_ns: int) -> None:
        """The call ended (at ``end_ns``; 0: now): completed, or failed with ``error``
        (torch's own exception).
        """
        end_ns = end_ns or time.time_ns()
        text = None if error is None else error_text(error)
        finish_record(rec, text, end_ns)
        if not rec.seq % FOLD_BACKSTOP:  # seqs count calls, per group or pair
            self.telemetry.fold()
        revoke = self.revoke
        if revoke is None or (text is None and revoke.record is None):
            return
        if text is None:
            revoke.completed(rec)
        else:
            revoke.on_failed(rec, text)  # the record it adopts is dumped at once

    # -- watchdog -------------------------------------------------------------------------

    def _expired(self, rec: CollectiveRecord, why: str) -> None:
        """The watchdog expired ``rec`` (and dumped): name the hang's origin in the job's
        revoke record (dumped again once adopted), and ask every rank to dump."""
        if self.revoke is not None:
            self.revoke.on_hang(rec)
        self.agent.request_dump(why)

    def _abort(self, rec: CollectiveRecord, why: str) -> None:
        """``CCLCTL_ON_HANG=abort``: abort the group (NCCL unblocks; gloo ignores it)."""
        group = next((c.group for c in list(self.comms.values()) if c.id == rec.comm), None)
        abort = getattr(self._dist.distributed_c10d, "_abort_process_group", None)
        if abort is None:
            return
        try:
            abort(group)
        except Exception as exc:
            log.warning("cclctl: aborting process group %s failed: %s", rec.comm, exc)

    # -- end ------------------------------------------------------------------------------

    def remove_dump_hooks(self) -> None:
        """Undo the dump triggers (``uninstrument()``); :meth:`close` keeps them on purpose:
        a ``finally`` that ends the session runs before an uncaught exception's hook."""
        undo, self._undo_dumps = self._undo_dumps, []
        for fn in reversed(undo):
            quietly(fn)

    def close(self) -> None:
        """Final status, then stop every thread and leave the job's store. Idempotent.

        The final status says "finished" only after a clean run (:meth:`Telemetry.finish`):
        not after a failed call, a revoke record, an uncaught exception (the exit hook set
        :attr:`Telemetry.exit_reason` before this runs at exit) or a SIGTERM.

        A forked child (a data loader worker exiting normally) inherits the session but
        none of its threads, and must not speak on the parent's store connections.
        """
        if self._closed or os.getpid() != self._pid:
            return
        self._closed = True
        if self.folder is not None:
            self.folder.stop()
        self.completions.poll()
        self.completions.close()
        if self.revoke is not None:
            self.revoke.close()
        try:
            self.agent.release()  # the last front end ends the agent's services
        finally:
            if self.store is not None:
                self.store.close()
