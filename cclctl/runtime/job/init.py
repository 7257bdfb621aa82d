"""Joining a job: rendezvous through the store, open the transport, build the communicator."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cclctl.config import RuntimeConfig, rendezvous_from_env, runtime_from_env
from cclctl.config_rendezvous import RendezvousConfig
from cclctl.errors import UsageError
from cclctl.records import CollectiveRecord
from cclctl.revocation import Revocation
from cclctl.runtime.agent import Agent, FailureHooks, for_process
from cclctl.runtime.comm.communicator import Communicator, world_comm_id
from cclctl.runtime.comm.recovery import retry_rules
from cclctl.runtime.identity import RankIdentity
from cclctl.runtime.job import link_telemetry
from cclctl.runtime.job.fanin_meeting import FanInMeeting
from cclctl.runtime.job.rendezvous import Rendezvous, join, join_store
from cclctl.runtime.job.retry import Retry, world_links
from cclctl.runtime.job.revoke_end import open_end
from cclctl.runtime.job.revoker import Revoker
from cclctl.runtime.job.survivors import Survivors
from cclctl.runtime.job.token import resolve_token
from cclctl.runtime.transport.hybrid import build_transport
from cclctl.runtime.transport.meeting import Exchange, TransportMeeting
from cclctl.runtime.transport.shm.segment import host_key
from cclctl.store.backends import endpoint_of, open_store
from cclctl.store.kv import KeyValueStore
from cclctl.telemetry.hub import Telemetry


def init(
    *,
    rank: int | None = None,
    world_size: int | None = None,
    store: KeyValueStore | str | None = None,
    config: RuntimeConfig | None = None,
    **flags: Any,
) -> Communicator:
    """Join the job and return its world communicator.

    With no arguments, everything comes from the environment (``cclctl launch``, torchrun,
    srun or mpirun). With ``rank``, ``world_size`` and ``store`` (a client, ``"host:port"``
    of a running store or ``"etcd://host:port,..."``) the caller places the rank itself.
    ``flags`` override :class:`~cclctl.config.RuntimeConfig` fields (``timeout_s=5``, ...).
    """
    cfg = config.replace(**flags) if config is not None else runtime_from_env(**flags)
    explicit = (rank, world_size, store)
    if any(v is not None for v in explicit):
        if rank is None or world_size is None or store is None:
            raise UsageError("cclctl.init(): give rank, world_size and store together, or none")
        where = endpoint_of(store) if isinstance(store, str) else (store.host, store.port)
        source = resolve_token(cfg, rank=rank, store=where, hosts_store=False, store_running=True)
        cfg = cfg.replace(token=source.token)
        client = (
            open_store(
                store,
                timeout_s=cfg.timeout_s,
                connect_timeout_s=cfg.connect_timeout_s,
                token=cfg.token or None,
            )
            if isinstance(store, str)
            else store
        )
        rdzv = join_store(client, rank, world_size, cfg, token_source=source)
        store_host = where[0]
    else:
        env = rendezvous_from_env()
        rdzv = join(env, cfg)
        store_host = env.store_host
    try:
        return _connect(rdzv, cfg, store_host)
    except BaseException:
        rdzv.close()
        raise


def init_at(where: RendezvousConfig, cfg: RuntimeConfig) -> Communicator:
    """Join the job at ``where`` and return its world communicator: for a front end that
    placed the rank itself (torch's ``cclctl`` backend, through
    :func:`cclctl.config.attach_from_env`), whose store is never on torch's own port."""
    rdzv = join(where, cfg)
    try:
        return _connect(rdzv, cfg, where.store_host)
    except BaseException:
        rdzv.close()
        raise


def _connect(rdzv: Rendezvous, cfg: RuntimeConfig, store_host: str) -> Communicator:
    # The world communicator's first life: a retry renews the links under the next epoch.
    links = world_links(rdzv.rank, rdzv.world_size, cfg, store_host, rdzv.token, epoch=0)
    transport = build_transport(  # takes over links: closes them on failure
        rdzv.rank,
        rdzv.world_size,
        cfg.job,
        _meeting(rdzv, cfg),
        links,
        choice=cfg.transport,
        host=f"{cfg.hostname}|{host_key()}",
        cross_memory=cfg.shm_cma,
    )
    comm_id = world_comm_id(rdzv.world_size)
    agent = _open_agent(rdzv, cfg, comm_id)
    telemetry = agent.telemetry
    link_telemetry.watch(telemetry, transport, links)

    def close() -> None:
        try:
            revoker.close()  # the revoke end is the agent's: the last front end closes it
            agent.release()  # the last status and final document say "finished"
        finally:
            rdzv.close()

    def expired(rec: CollectiveRecord, why: str) -> None:
        """The policy decides what becomes of the call, naming the rank the hang waits on
        as the job agrees it (the live diagnosis of its statuses), in the world's
        communicator or the one a shrink made; every rank of the job dumps."""
        state = survivors.failure_of(rec, comm)
        origin = None
        if cfg.on_hang == "raise" and not rec.end_ns and rec.comm == state.comm:
            origin = revoker.hang_origin(rec, state.hang_record(rec))
        state.hung(rec, why, cfg.on_hang, origin)
        agent.request_dump(why)

    agent.register(comm_id, range(rdzv.world_size), FailureHooks(expired))
    survivors = Survivors(rdzv, cfg, store_host, telemetry)
    comm = Communicator(
        rank=rdzv.rank,
        world_size=rdzv.world_size,
        transport=transport,
        cfg=cfg,
        comm_id=comm_id,
        tracer=telemetry,
        on_close=close,
        watchdog=True,
        shrinker=survivors,
        retrier=_retrier(rdzv, cfg, store_host, telemetry),
        identity=_identity(rdzv, cfg, telemetry),
    )
    revoker = _revoker(rdzv, agent, comm, lambda: survivors.revoke_record(comm))
    survivors.revoker = revoker  # a shrunk communicator's failures go through the store too
    agent.watch()
    return comm


def _retrier(rdzv: Rendezvous, cfg: RuntimeConfig, store_host: str, telemetry: Telemetry) -> Retry:
    """The world communicator's retrier: the job's store as this rank joined it; it follows
    the job's revoke record (through the revoker)."""
    return Retry(cfg, job=rdzv.job, store=rdzv.store.address, token=rdzv.token,
                 store_host=store_host, telemetry=telemetry)  # fmt: skip


def _meeting(rdzv: Rendezvous, cfg: RuntimeConfig) -> TransportMeeting | Exchange:
    """How the world's ranks meet to open the transport: through the world document and
    their host agents after a fan-in rendezvous, else in the job's exchange rounds."""
    if rdzv.host_keys is not None:
        return FanInMeeting(rdzv.job_store, rdzv.rank, rdzv.world_size, rdzv.host_keys,
                            rdzv.tcp_ranks, cfg.connect_timeout_s, rdzv.agent_socket)  # fmt: skip
    return lambda key, value: rdzv.exchange(key, value, cfg.connect_timeout_s)


def _identity(rdzv: Rendezvous, cfg: RuntimeConfig, telemetry: Telemetry) -> RankIdentity:
    """Where this rank's failures point: its host, its dump folder, every rank's process."""
    peers = tuple(zip(rdzv.hosts, rdzv.pids, strict=False))
    return RankIdentity(cfg.hostname, telemetry.dump_dir.rstrip("/") + "/", peers)


def _revoker(
    rdzv: Rendezvous,
    agent: Agent,
    comm: Communicator,
    carried: Callable[[], Revocation | None],
) -> Revoker:
    """The world communicator's follower of the agent's revoke end (``carried()``: the
    record this rank's documents carry)."""
    telemetry = agent.telemetry
    return Revoker(
        open_end(agent.revoke_end, rdzv.store.address, rdzv.token, rdzv.job, telemetry),
        comm.failure,
        in_call=lambda: _in_call(telemetry),
        dump=telemetry.dump,
        publish=telemetry.publish_now,
        deferred=lambda rev: retry_rules.enabled(comm) and rev.kind in retry_rules.RETRIED_KINDS,
        no_retry=lambda: retry_rules.why_not(comm),
        carried=carried,
    )


def _in_call(telemetry: Telemetry) -> str:
    """The call this rank is in, as an acknowledgement of a revoke says it."""
    inflight = telemetry.inflight()
    return f"{inflight[0].op} seq {inflight[0].seq}" if inflight else ""


def _open_agent(rdzv: Rendezvous, cfg: RuntimeConfig, comm_id: str) -> Agent:
    """This rank's agent with its services started: counters and flight recorder always;
    the exporter when a port is configured; the status line to the job's store. Dumps on
    every way out (unless another front end of this rank installed its triggers first).
    """
    agent = for_process(cfg, rdzv.rank, rdzv.world_size, rdzv.local_rank)
    telemetry = agent.telemetry
    telemetry.register_comm(comm_id, list(range(rdzv.world_size)))  # in the first status
    undo: list[Callable[[], None]] = []
    try:
        undo = agent.install_dumps(lambda: _install_dumps(telemetry))
        agent.serve_metrics()
        agent.attach(rdzv)
    except BaseException:
        for fn in undo:
            fn()
        agent.release()
        raise
    return agent


def _install_dumps(telemetry: Telemetry) -> list[Callable[[], None]]:
    """Dumps on every way out, into the job's folder unless CCLCTL_TRACE_DIR names another,
    with an earlier run's documents removed."""
    telemetry.remove_stale_dumps()
    if threading.current_thread() is threading.main_thread():
        telemetry.install_signal_dump()  # kill -USR1 <pid>: dump now, keep running
        telemetry.install_termination_dump()
        telemetry.install_exit_dump()
    return [telemetry.remove_hooks]
