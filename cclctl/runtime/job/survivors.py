"""Building the survivors' communicator after a rank died: ``comm.shrink()`` of a job's comm.

The old communicator is released first (its calls refused, its links and segments closed:
nothing waits on a peer), the survivors agree on the members in the store
(:mod:`~cclctl.runtime.job.shrink`), then a new transport opens among them alone, through
a rendezvous scoped to the shrink, with links of epoch ``n``. The new communicator's id is
``<n>:<its members' global ranks, folded>``, it is registered with telemetry under those
global ranks, and it takes over the job's close, the watchdog's expiries and the job's
revoke record (cleared of the failure the shrink got past).
"""

from __future__ import annotations

from cclctl import revocation
from cclctl.config import RuntimeConfig
from cclctl.errors import CommError
from cclctl.ranges import fold_ranks
from cclctl.records import CollectiveRecord
from cclctl.runtime.comm.communicator import Communicator
from cclctl.runtime.comm.recovery.shrink_rules import ShrinkInfo
from cclctl.runtime.failure import FailureState
from cclctl.runtime.identity import RankIdentity
from cclctl.runtime.job import link_telemetry
from cclctl.runtime.job.rendezvous import Rendezvous
from cclctl.runtime.job.revoke_key import read_record
from cclctl.runtime.job.revoker import Revoker
from cclctl.runtime.job.shrink import Agreement, Joined, ShrinkExchange, agree
from cclctl.runtime.transport.hybrid import build_transport
from cclctl.runtime.transport.shm.segment import host_key
from cclctl.runtime.transport.tcp.address import local_address_towards
from cclctl.runtime.transport.tcp.links import Links
from cclctl.store.backends import open_store
from cclctl.store.scope import ScopedStore
from cclctl.telemetry.hub import Telemetry


def creation_index(comm_id: str) -> int:
    """``3:0-2,4`` -> 3."""
    return int(comm_id.partition(":")[0])


class Survivors:
    """The job's side of shrinking: what a new communicator needs (the rendezvous, the
    configuration, telemetry) and which communicator is the job's current one."""

    def __init__(
        self, rdzv: Rendezvous, cfg: RuntimeConfig, store_host: str, telemetry: Telemetry
    ) -> None:
        self.rdzv = rdzv
        self.cfg = cfg
        self.store_host = store_host
        self.telemetry = telemetry
        self.current: Communicator | None = None  # the one whose hung calls the watchdog fails
        #: the failure the last shrink got past, which documents keep as history
        self.got_past: revocation.Revocation | None = None
        #: the job's end of its revoke record, which follows the current communicator
        self.revoker: Revoker | None = None

    def __call__(
        self, comm: Communicator, exclude: frozenset[int], timeout_s: float | None, call: str
    ) -> Communicator:
        """Shrink ``comm`` to its live ranks (``exclude``: more old ranks to leave out)."""
        n = creation_index(comm.id) + 1
        excluded = set(exclude)
        first = comm.failure.first
        if first is not None and first.kind == "died" and first.origin in comm.members:
            excluded.add(comm.members.index(first.origin))  # origins are the job's ranks
        if comm.rank in excluded:
            raise CommError(f"rank {comm.rank}: cannot shrink {comm.id} without itself")
        kept = comm.kept.seq
        self.got_past = comm.failure.first or self.got_past
        mine = Joined(comm.rank, comm.completed, kept, call)
        comm.release()  # nothing after this waits on the old communicator's peers
        with open_store(
            self.rdzv.store.address,
            timeout_s=self.cfg.connect_timeout_s,
            connect_timeout_s=self.cfg.connect_timeout_s,
            token=self.rdzv.token or None,
        ) as client:
            scoped = ScopedStore.for_job(client, self.rdzv.job)
            wait_s = self.cfg.timeout_s if timeout_s is None else timeout_s
            agreement = agree(scoped, n, comm.world_size, mine, frozenset(excluded), wait_s)
            clear_shrunk_record(scoped, comm, self.rdzv.rank)
            new = self._build(comm, agreement, scoped)
        new.shrink_info = _info(comm, agreement)
        if self.revoker is not None:
            self.revoker.follow(new.failure)
        return new

    def _build(self, old: Communicator, agreement: Agreement, scoped: ScopedStore) -> Communicator:
        n, cfg = agreement.n, self.cfg
        rank, size = agreement.members.index(old.rank), len(agreement.members)
        members = [old.members[r] for r in agreement.members]
        links = Links(
            rank,
            size,
            cfg.job,
            local_address_towards(self.store_host),
            cfg.connect_timeout_s,
            token=self.rdzv.token,
            mac=cfg.link_mac,
            epoch=n,  # a link of the old communicator's life is refused
        )
        transport = build_transport(  # takes over links: closes them on failure
            rank,
            size,
            cfg.job,
            ShrinkExchange(scoped, n, rank, size, cfg.connect_timeout_s),
            links,
            choice=cfg.transport,
            host=f"{cfg.hostname}|{host_key()}",
            cross_memory=cfg.shm_cma,
        )
        comm_id = f"{n}:{fold_ranks(members)}"
        self.telemetry.register_comm(comm_id, members)
        link_telemetry.watch(self.telemetry, transport, links, members)
        new = Communicator(
            rank=rank,
            world_size=size,
            transport=transport,
            cfg=cfg,
            comm_id=comm_id,
            tracer=self.telemetry,
            on_close=old._on_close,  # the job's close goes with the current communicator
            watchdog=True,
            members=members,
            shrinker=self,
            # by the job's rank, as every origin is
            identity=RankIdentity(cfg.hostname, old.failure.evidence, old.failure.peers),
        )
        old._on_close = None
        new.failure.epoch = n
        self.current = new
        return new

    def revoke_record(self, world: Communicator) -> revocation.Revocation | None:
        """The failure a rank's documents carry: the current communicator's, else the one
        the last shrink got past (the diagnosis reads it as history once the survivors run
        on: ``comm 0:0-7 shrank to 1:0-5,7``)."""
        return (self.current or world).failure.first or self.got_past

    def failure_of(self, rec: CollectiveRecord, world: Communicator) -> FailureState:
        """The failure state a hung ``rec`` fails: the current shrunk communicator's, where
        it is one of its calls, else the world's (whose ``hung`` leaves another's alone)."""
        comm = self.current
        return comm.failure if comm is not None and rec.comm == comm.id else world.failure


def clear_shrunk_record(scoped: ScopedStore, old: Communicator, job_rank: int) -> None:
    """Remove the job's record if it is the failure this shrink got past (one of the old
    communicator's, or the one it adopted, such as an operator's abort), and this rank's
    acknowledgement of it: the key then serves the shrunk communicator's failures. Every
    survivor has joined the shrink, so each has failed and none writes a record of the
    old communicator after this."""
    rev, first = read_record(scoped), old.failure.first
    if rev is not None and (
        rev.comm == old.id or (first is not None and rev.time_ns == first.time_ns)
    ):
        scoped.delete(revocation.KEY)
    scoped.delete(revocation.ack_key(job_rank))


def _info(old: Communicator, agreement: Agreement) -> ShrinkInfo:
    """The agreement as the new communicator's ranks see it."""
    entries = [agreement.entries[r] for r in agreement.members]
    excluded = [old.members[r] for r in range(old.world_size) if r not in agreement.entries]
    return ShrinkInfo(
        n=agreement.n,
        excluded=excluded,
        done={i: e.done for i, e in enumerate(entries)},
        kept={i: e.kept for i, e in enumerate(entries)},
        call={i: e.call for i, e in enumerate(entries)},
    )
