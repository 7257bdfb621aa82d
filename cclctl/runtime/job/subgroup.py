"""A sub-communicator: some of the job's ranks with a transport of their own.

Built beside the world communicator (torch's ``new_group`` on the ``cclctl`` backend):
the members meet in the job's store under ``group/<name>/`` (``name``: the same on every
member, e.g. torch's group name), open links and shared memory among themselves alone,
and run calls as any communicator does. Its id is ``<name>:<folded member ranks>`` (the
torch integration's convention for groups); telemetry counts its calls and link bytes under
the job's ranks, and the watchdog expires its hung calls through its own failure state.

It recovers as the world does from a link fault: its links keep their tails, so a reset
link is made again inside the step, and where the world retries (``CCLCTL_RETRY_BUDGET``
on, TCP or hybrid links) it retries too, through its own agreement in the job's store
under ``retry/<its id>/`` among its members alone (:class:`~cclctl.runtime.job.retry.Retry`),
with the world's guarantees (exact results). It has no shrink and publishes no revoke
record: any other failure fails it alone, and the error names the peer as every error does.
"""

from __future__ import annotations

from collections.abc import Sequence

from cclctl.config import RuntimeConfig
from cclctl.errors import RendezvousError, UsageError
from cclctl.ranges import fold_ranks
from cclctl.records import CollectiveRecord
from cclctl.runtime.agent import Agent, FailureHooks
from cclctl.runtime.agent.process import current
from cclctl.runtime.comm.communicator import Communicator
from cclctl.runtime.identity import RankIdentity
from cclctl.runtime.job import link_telemetry
from cclctl.runtime.job.retry import Retry, world_links
from cclctl.runtime.job.store_exchange import StoreExchange
from cclctl.runtime.job.token import resolve_token
from cclctl.runtime.transport.hybrid import build_transport
from cclctl.runtime.transport.shm.segment import host_key
from cclctl.runtime.transport.tcp.links import Links
from cclctl.store.backends import endpoint_of, open_store
from cclctl.store.scope import ScopedStore


def open_subgroup(
    world: Communicator, store: str, members: Sequence[int], name: str
) -> Communicator:
    """The communicator of ``members`` (job ranks, in the group's order; this rank among
    them), meeting in the job's store at address ``store``. Every member calls this
    together."""
    members = [int(m) for m in members]
    job_rank = world.members[world.rank]
    if job_rank not in members or len(set(members)) != len(members):
        raise UsageError(f"rank {job_rank}: a group of ranks {members} must hold it, once each")
    cfg = world.cfg
    rank, size = members.index(job_rank), len(members)
    where = endpoint_of(store)
    token = resolve_token(cfg, rank=job_rank, store=where, hosts_store=False, store_running=True)
    with open_store(
        store,
        timeout_s=cfg.connect_timeout_s,
        connect_timeout_s=cfg.connect_timeout_s,
        token=token.token or None,
    ) as client:
        scoped = ScopedStore.for_job(client, cfg.job)
        exchange = GroupExchange(scoped, f"group/{name}/x/", members, rank, cfg.connect_timeout_s)
        links = world_links(rank, size, cfg, where[0], token.token, epoch=0)
        transport = build_transport(  # takes over links: closes them on failure
            rank, size, cfg.job, exchange, links,
            choice=cfg.transport, host=f"{cfg.hostname}|{host_key()}", cross_memory=cfg.shm_cma,
        )  # fmt: skip
    comm_id = f"{name}:{fold_ranks(members)}"
    agent = current(job_rank)
    retrier = Retry(
        cfg, job=cfg.job, store=store, token=token.token, store_host=where[0],
        telemetry=agent.telemetry if agent is not None else None, follows_record=False,
    )  # fmt: skip
    comm = Communicator(
        rank=rank,
        world_size=size,
        transport=transport,
        cfg=cfg,
        comm_id=comm_id,
        tracer=world.tracer,
        watchdog=True,
        members=members,
        retrier=retrier,
        identity=RankIdentity(cfg.hostname, world.failure.evidence, world.failure.peers),
    )
    if agent is not None:
        _register(comm, cfg, agent, links)
    return comm


def _register(comm: Communicator, cfg: RuntimeConfig, agent: Agent, links: Links) -> None:
    """Telemetry counts the group's calls and links; the watchdog expires its hung calls."""
    agent.telemetry.register_comm(comm.id, comm.members)
    link_telemetry.watch(agent.telemetry, comm.transport, links, comm.members)

    def expired(rec: CollectiveRecord, why: str) -> None:
        comm.failure.hung(rec, why, cfg.on_hang)

    agent.register(comm.id, comm.members, FailureHooks(expired))


class GroupExchange(StoreExchange):
    """The group's transport rendezvous: publish a value, get every member's, by group
    rank, under ``prefix`` (a key again starts a new round); a member that never joins
    is named by its job rank."""

    def __init__(
        self, scoped: ScopedStore, prefix: str, members: list[int], rank: int, timeout_s: float
    ) -> None:
        def missing(key: str, ranks: list[int]) -> RendezvousError:
            absent = [members[r] for r in ranks]
            return RendezvousError(
                f"group {prefix.split('/')[1]} of ranks {fold_ranks(members)}: "
                f"ranks {fold_ranks(absent)} never joined it within {timeout_s:g}s "
                "(every member creates the group)",
                missing=fold_ranks(absent),
            )

        super().__init__(scoped, prefix, rank, len(members), timeout_s, missing)
