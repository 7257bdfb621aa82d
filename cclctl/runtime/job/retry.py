"""Renewing a communicator's transport after a link fault: the job's side of a retry.

Every rank of the communicator writes what it brings (:class:`~cclctl.runtime.comm.
recovery.retry_rules.Ask`) under ``retry/<comm>/<epoch>/in/<rank>`` in the job's store,
``epoch`` being the communicator's next one, and waits for all of them until the budget's
deadline (:mod:`~cclctl.runtime.job.retry_agreement`): nobody re-runs alone. All read the
same entries, so all make the same plan. Then the old transport is closed, a new one opens
through a rendezvous scoped to ``retry/<comm>/<epoch>/x/`` with links of the new epoch (a
socket of the old life is refused at its handshake), and the failure state starts the new
epoch: its calls run again. Once every rank's entry is there, each clears the job's
``revoke`` key of the record this retry got past (and its own acknowledgement), so a later
failure, an abort or another ``cclctl retry`` can be written; each writes
``retry/<comm>/<epoch>/up/<rank>`` once its new transport is up (what ``cclctl retry``
waits for).

A sub-communicator (torch's ``new_group``) retries the same way under its own id
(``<name>:<folded members>``), its ranks being its group ranks; it follows no revoke record
(the world's revoker does), so its retry clears none, and a rank it maps to a process, or a
death it reads in the job's record, goes through its members' job ranks.
"""

from __future__ import annotations

import dataclasses
import json
import time

from cclctl import revocation
from cclctl.config import RuntimeConfig
from cclctl.errors import CclError, CommError, StoreTimeout
from cclctl.runtime.comm.recovery.port import Port
from cclctl.runtime.comm.recovery.retry_plan import decide
from cclctl.runtime.comm.recovery.retry_rules import RETRIED_KINDS, Ask, Plan
from cclctl.runtime.job import link_telemetry
from cclctl.runtime.job.retry_agreement import agree, gone
from cclctl.runtime.job.revoke_key import read_record
from cclctl.runtime.job.shrink import ShrinkExchange
from cclctl.runtime.transport.base import Transport, announcer
from cclctl.runtime.transport.hybrid import build_transport
from cclctl.runtime.transport.shm.segment import host_key
from cclctl.runtime.transport.tcp.address import local_address_towards
from cclctl.runtime.transport.tcp.links import Links
from cclctl.store.backends import open_store
from cclctl.store.kv import KeyValueStore
from cclctl.store.scope import ScopedStore
from cclctl.telemetry.hub import Telemetry

#: The longest a link's sent bytes may stay unacknowledged before it counts as stalled.
STALL_MAX_S = 1.0
#: The longest a reset link may take to be made again in the step before its fault goes on
#: to the retry: a peer in the same call links again within milliseconds, a busy one when
#: it next uses the link, a dead one never.
RESUME_MAX_S = 2.0
#: The longest pause between a retry's tries to reach the store: a store behind the broken
#: route answers within this of the route's return (a refused try costs the kernel
#: microseconds, so 20 a second is no busy loop).
STORE_RETRY_DELAY_S = 0.05


#: The longest a rank whose call is not re-run spends telling the agreement so.
REFUSE_S = 5.0


def _tenth_of_budget(cfg: RuntimeConfig, most_s: float) -> float:
    """A tenth of the retry budget, at most ``most_s``; 0 with retry off."""
    return min(most_s, cfg.retry_budget_s / 10) if cfg.retry_budget_s > 0 else 0.0


def stall_s(cfg: RuntimeConfig) -> float:
    """How long a stalled link takes to fail with retry on (a tenth of the budget, at most
    :data:`STALL_MAX_S`); 0 (the kernel's own, minutes) with retry off."""
    return _tenth_of_budget(cfg, STALL_MAX_S)


def resume_s(cfg: RuntimeConfig) -> float:
    """How long a reset link may take to be made again (a tenth of the budget, at most
    :data:`RESUME_MAX_S`); 0 (never: the fault fails the step) with retry off."""
    return _tenth_of_budget(cfg, RESUME_MAX_S)


def world_links(rank: int, size: int, cfg: RuntimeConfig, store_host: str, token: str,
                epoch: int) -> Links:  # fmt: skip
    """This rank's links of ``epoch``, as the job's transport opens them."""
    return Links(
        rank,
        size,
        cfg.job,
        local_address_towards(store_host),
        cfg.connect_timeout_s,
        token=token,
        mac=cfg.link_mac,
        epoch=epoch,
        stall_s=stall_s(cfg),
        resume_s=resume_s(cfg),
    )


class Retry:
    """A communicator's retrier (:class:`~cclctl.runtime.comm.recovery.retry_rules.Retrier`):
    where the job's store is (``job``, ``store``: its address, ``token``), the host links
    face (``store_host``), the configuration and telemetry a new transport needs. The job's
    world communicator has one (:mod:`~cclctl.runtime.job.init`), and so does each
    sub-communicator (:mod:`~cclctl.runtime.job.subgroup`): its agreement is keyed by its own
    id, among its own ranks. ``follows_record``: the communicator follows the job's revoke
    record (the world's, through its revoker), so its retry clears the record it got past
    and this rank's acknowledgement; a sub-communicator follows none and leaves both to the
    world."""

    def __init__(
        self,
        cfg: RuntimeConfig,
        *,
        job: str,
        store: str,
        token: str,
        store_host: str,
        telemetry: Telemetry | None,
        follows_record: bool = True,
    ) -> None:
        self.cfg = cfg
        self.job = job
        self.store = store
        self.token = token
        self.store_host = store_host
        self.telemetry = telemetry
        self.follows_record = follows_record

    def __call__(self, comm: Port, ask: Ask) -> Plan:
        epoch = comm.failure.epoch + 1
        prefix = f"retry/{comm.id}/{epoch}/"
        comm.transport.close()  # the failure was announced on it; its links are done
        try:
            with self._client(ask.deadline) as client:
                scoped = ScopedStore.for_job(client, self.job)
                entries = agree(scoped, prefix, comm, ask)
                plan = decide(comm.rank, entries)
                if self.follows_record:
                    clear_revoke_key(scoped, comm.id, epoch, comm.members[comm.rank])
                transport = self._build(comm, epoch, scoped, prefix, ask.deadline)
                scoped.set(f"{prefix}up/{comm.rank}", b"1")
        except CclError as exc:
            if isinstance(exc, CommError):
                raise
            raise CommError(f"rank {comm.rank}: retry of {comm.id}: {exc}") from exc
        comm.renew(transport)
        comm.failure.bump_epoch(announcer(transport))
        if self.telemetry is not None:
            self.telemetry.count_retry(comm.id, ask.call)  # cclctl_collective_retries_total
        return plan

    def refuse(self, comm: Port, ask: Ask) -> None:
        """Write this rank's entry for the next epoch and return: the call it was in is
        not re-run, so every rank's plan fails at once, naming it
        (:func:`~cclctl.runtime.comm.recovery.retry_plan.decide`)."""
        prefix = f"retry/{comm.id}/{comm.failure.epoch + 1}/"
        with self._client(min(ask.deadline, time.monotonic() + REFUSE_S)) as client:
            scoped = ScopedStore.for_job(client, self.job)
            scoped.set(f"{prefix}in/{comm.rank}", json.dumps(dataclasses.asdict(ask)).encode())

    def all_closed(self, comm: Port, ask: Ask, wait_s: float) -> bool:
        """Write ``retry/<comm>/closed/<rank>`` (this rank closes after ``ask.pending - 1``)
        and wait up to ``wait_s`` for every rank's; a rank whose process on this host is
        gone counts as closed (it has nothing left to retry)."""
        prefix = f"retry/{comm.id}/closed/"
        with self._client(min(ask.deadline, time.monotonic() + REFUSE_S)) as client:
            scoped = ScopedStore.for_job(client, self.job)
            scoped.set(f"{prefix}{comm.rank}", json.dumps(dataclasses.asdict(ask)).encode())
            present = scoped.list(prefix)
            missing = [f"{prefix}{r}" for r in range(comm.world_size)
                       if f"{prefix}{r}" not in present and not gone(comm, r)]  # fmt: skip
            try:
                scoped.wait(missing, timeout_s=wait_s)
            except StoreTimeout:
                return False
        return True

    def leave(self, comm: Port, ask: Ask) -> None:
        """Write ``retry/<comm>/left/<rank>``: this rank closed for good, so a retry that
        waits for it fails at once (:func:`~.retry_agreement.agree`), naming it."""
        with self._client(min(ask.deadline, time.monotonic() + REFUSE_S)) as client:
            scoped = ScopedStore.for_job(client, self.job)
            entry = json.dumps(dataclasses.asdict(ask)).encode()
            scoped.set(f"retry/{comm.id}/left/{comm.rank}", entry)

    def _client(self, deadline: float) -> KeyValueStore:
        left = max(0.05, deadline - time.monotonic())
        return open_store(
            self.store,
            timeout_s=left,
            connect_timeout_s=left,
            token=self.token or None,
            max_retry_delay_s=STORE_RETRY_DELAY_S,
        )

    def _build(
        self, comm: Port, epoch: int, scoped: ScopedStore, prefix: str, deadline: float
    ) -> Transport:
        rank, size, cfg = comm.rank, comm.world_size, self.cfg
        links = world_links(rank, size, cfg, self.store_host, self.token, epoch)
        left = max(0.05, deadline - time.monotonic())
        transport = build_transport(  # takes over links: closes them on failure
            rank,
            size,
            cfg.job,
            ShrinkExchange(scoped, epoch, rank, size, left, prefix=f"{prefix}x/"),
            links,
            choice=cfg.transport,
            host=f"{cfg.hostname}|{host_key()}",
            cross_memory=cfg.shm_cma,
        )
        if self.telemetry is not None:
            link_telemetry.watch(self.telemetry, transport, links, comm.members)
        return transport


def clear_revoke_key(scoped: ScopedStore, comm_id: str, epoch: int, rank: int) -> None:
    """Remove the job's record if it is what this retry (into ``epoch``) got past: a link
    fault of an earlier epoch of ``comm_id``, or an operator's retry; and the ack of job rank
    ``rank`` (this one's).
    Every rank has written its entry by now, so none writes a record of the old life."""
    rev = read_record(scoped)
    if (
        rev is not None
        and rev.kind in RETRIED_KINDS
        and rev.comm in ("", comm_id)
        and (rev.origin == revocation.OPERATOR or rev.epoch < epoch)
    ):
        scoped.delete(revocation.KEY)
    scoped.delete(revocation.ack_key(rank))
