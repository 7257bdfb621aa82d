"""Rendezvous: ranks find the store, claim their rank ids and agree on the world size.

Every check names the ranks and the processes involved, because a rendezvous that fails
with "timeout" sends an SRE hunting through every host; one that says "rank 3 is claimed
twice: by host-a pid 100 and host-b pid 200" does not.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from typing import Any

from cclctl.config import (
    RuntimeConfig,
    StoreServerConfig,
    store_server_from_env,
)
from cclctl.config_rendezvous import RendezvousConfig
from cclctl.errors import RendezvousError
from cclctl.runtime.job.fanin_rank import join_fanin
from cclctl.runtime.job.gather import ERROR_KEY, gather
from cclctl.runtime.job.job_store import bind_host as _bind_host
from cclctl.runtime.job.job_store import connect, connect_live
from cclctl.runtime.job.store_process import DetachedStore, spawn_store
from cclctl.runtime.job.token import GIVEN, TokenSource, agree_token, publish_check, resolve_token
from cclctl.store.backends import open_store
from cclctl.store.kv import KeyValueStore
from cclctl.store.scope import ScopedStore


@dataclasses.dataclass
class Rendezvous:
    """This rank's place in the job, and its connection to the job's store.

    ``job_store`` sees only this job's keys. ``close`` closes the store client. On rank 0,
    ``server`` is the store process it started, which outlives it (see
    :mod:`cclctl.runtime.job.store_process`), so no rank waits for another to close.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    store: KeyValueStore
    server: DetachedStore | None = None
    job: str = "default"
    hosts: list[str] = dataclasses.field(default_factory=list)  # host of every rank, by rank
    pids: list[int] = dataclasses.field(default_factory=list)  # pid of every rank, by rank
    token: str = ""  # the job's token, as every rank agreed on it (see runtime/job/token.py)
    #: a fan-in rendezvous' every rank's host key and the ranks that asked for TCP (from the
    #: world document: the transport meets through them, runtime/job/fanin_meeting.py);
    #: None after the flat rendezvous (the transport meets in exchange rounds)
    host_keys: list[str] | None = None
    tcp_ranks: list[int] = dataclasses.field(default_factory=list)
    #: the rendezvous socket of the host agent that carried this rank's claim ("" if none):
    #: it carries the transport meeting too
    agent_socket: str = ""
    _rounds: dict[str, int] = dataclasses.field(default_factory=dict, repr=False)
    _closed: bool = dataclasses.field(default=False, repr=False)

    @property
    def job_store(self) -> ScopedStore:
        return ScopedStore.for_job(self.store, self.job)

    def exchange(self, key: str, value: bytes, timeout_s: float) -> list[bytes]:
        """Publish ``value`` under ``key``; return every rank's value, indexed by rank.

        Every rank must call ``exchange`` with the same keys in the same order; calling it
        again with a key starts a new round, so a stale value is never returned.
        """
        round_no = self._rounds.get(key, 0)
        self._rounds[key] = round_no + 1
        prefix = f"x/{key}/{round_no}/"
        scoped = self.job_store
        scoped.set(f"{prefix}{self.rank}", value)
        return gather(scoped, prefix, self.world_size, timeout_s, f"exchange {key!r}")

    def close(self) -> None:
        """Leave the store; on rank 0 the store process serves on (see ``server``)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.store.close()
        finally:
            if self.server is not None:
                self.server.close()


def join(
    rdzv: RendezvousConfig, cfg: RuntimeConfig, hosting: StoreServerConfig | None = None
) -> Rendezvous:
    """Join the job described by the environment: rank 0 hosts the store unless one runs
    (cclctl's own, or an etcd cluster: ``CCLCTL_STORE=etcd://...``).

    The rank gets the job's token first (:func:`~cclctl.runtime.job.token.resolve_token`).
    The store rank 0 starts is a process of its own with that token, listening where
    ``hosting`` says (default: ``CCLCTL_STORE_ADDR``, ``CCLCTL_STORE_MAX_FRAME``), which
    outlives the ranks by ``CCLCTL_STORE_LINGER``; a rank that fails to join leaves it
    serving, so the others read why.
    """
    if rdzv.store_url:
        return _join_etcd(rdzv, cfg)
    server = None
    host, port = rdzv.store_host, rdzv.store_port
    hosts_store = not rdzv.store_external and rdzv.rank == 0
    source = resolve_token(
        cfg,
        rank=rdzv.rank,
        store=(host, port),
        hosts_store=hosts_store,
        store_running=rdzv.store_external,
    )
    cfg = cfg.replace(token=source.token)
    if hosts_store:
        hosting = store_server_from_env() if hosting is None else hosting
        bind = _bind_host(host, hosting.bind)
        server = spawn_store(bind, port, cfg.token, hosting, job=cfg.job, folder=source.folder)
        host, port = server.host, server.port
    try:
        client = (connect if hosts_store else connect_live)(host, port, cfg, source)
        cfg = cfg.replace(token=source.token)
    except BaseException:
        if server is not None:
            server.close()
        raise
    try:
        place = (rdzv.local_rank, rdzv.local_world_size)
        if cfg.host_agent:  # through the host agent (runtime/job/fanin_rank.py)
            joined = _join_fanin(client, rdzv.rank, rdzv.world_size, cfg, place, source)
        else:
            joined = join_store(client, rdzv.rank, rdzv.world_size, cfg, *place, source)
    except BaseException:
        client.close()
        if server is not None:
            server.close()
        raise
    joined.server = server
    return joined


def _join_fanin(
    store: KeyValueStore,
    rank: int,
    world_size: int,
    cfg: RuntimeConfig,
    place: tuple[int, int],
    source: TokenSource,
) -> Rendezvous:
    """Join with the rank's claim carried by its host's agent (alone without one)."""
    _check_rank(rank, world_size)
    joined = join_fanin(ScopedStore.for_job(store, cfg.job), rank, world_size, cfg, place, source)
    return Rendezvous(rank=rank, world_size=world_size, local_rank=place[0],
                      local_world_size=place[1], store=store, job=cfg.job, hosts=joined.hosts,
                      pids=joined.pids, token=joined.token, host_keys=joined.keys,
                      tcp_ranks=joined.tcp, agent_socket=joined.agent)  # fmt: skip


def _join_etcd(rdzv: RendezvousConfig, cfg: RuntimeConfig) -> Rendezvous:
    """Join through the etcd cluster ``CCLCTL_STORE`` names: no rank starts a store. The
    job's token (for the ranks' links: etcd does not check it) is ``CCLCTL_TOKEN``, else
    rank 0 makes one and the ranks of its host read it from the job's folder."""
    source = resolve_token(
        cfg,
        rank=rdzv.rank,
        store=(rdzv.store_host, rdzv.store_port),
        hosts_store=rdzv.rank == 0,
        store_running=False,
    )
    cfg = cfg.replace(token=source.token)
    client = open_store(
        rdzv.store_url, timeout_s=cfg.timeout_s, connect_timeout_s=cfg.connect_timeout_s
    )
    try:
        return join_store(
            client, rdzv.rank, rdzv.world_size, cfg, rdzv.local_rank, rdzv.local_world_size, source
        )
    except BaseException:
        client.close()
        raise


def join_store(
    store: KeyValueStore,
    rank: int,
    world_size: int,
    cfg: RuntimeConfig,
    local_rank: int = 0,
    local_world_size: int = 1,
    token_source: TokenSource | None = None,
) -> Rendezvous:
    """Join through a running store: check the world size, claim the rank, wait for all,
    and agree on the job's token (rank 0 leaves a proof of ``cfg.token``, the others check
    theirs against it, reading ``token_source``'s file again while theirs is stale)."""
    _check_rank(rank, world_size)
    scoped = ScopedStore.for_job(store, cfg.job)
    me = {"rank": rank, "host": cfg.hostname, "pid": os.getpid()}
    _agree_world_size(scoped, world_size, me)
    if rank == 0 and cfg.token:
        publish_check(scoped, cfg.token, cfg.job)
    _claim_rank(scoped, rank, dict(me, nonce=secrets.token_hex(8)))
    claims = gather(scoped, "rdzv/rank/", world_size, cfg.connect_timeout_s, "rendezvous")
    parsed = [_claim(raw) for raw in claims]
    token = cfg.token
    if rank != 0 and token:
        source = token_source or TokenSource(token, GIVEN, "")
        token = agree_token(scoped, source, rank, cfg.job, cfg.connect_timeout_s)
    return Rendezvous(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        store=store,
        job=cfg.job,
        hosts=[str(claim.get("host", "?")) for claim in parsed],
        pids=[_pid(claim) for claim in parsed],
        token=token,
    )


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise RendezvousError(
            f"rank {rank} is out of range for world size {world_size}",
            rank=rank,
            world_size=world_size,
        )


def _claim(raw: bytes) -> dict[str, Any]:
    try:
        claim = json.loads(raw)
    except ValueError:
        return {}
    return claim if isinstance(claim, dict) else {}


def _pid(claim: dict[str, Any]) -> int:
    pid = claim.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else 0


def _who(claim: dict[str, Any]) -> str:
    return f"{claim.get('host', '?')} pid {claim.get('pid', '?')}"


def _agree_world_size(scoped: ScopedStore, world_size: int, me: dict[str, Any]) -> None:
    mine = json.dumps(dict(me, world_size=world_size)).encode()
    first = json.loads(scoped.compare_set("rdzv/world_size", None, mine))
    if first.get("fanin"):  # that rank's host agent carried its claim (runtime/hostagent/fanin.py)
        message = (f"rendezvous path disagreement: rank {me['rank']} ({_who(me)}) joins without "
                   f"a host agent, but rank {first.get('rank')} ({_who(first)}) joined through "
                   "one: set the same CCLCTL_HOST_AGENT on every rank")  # fmt: skip
        _report(scoped, message)
        raise RendezvousError(message, rank=me["rank"])
    if first.get("world_size") != world_size:
        message = (
            f"world size disagreement: rank {me['rank']} ({_who(me)}) was started with world "
            f"size {world_size}, but rank {first.get('rank')} ({_who(first)}) set it to "
            f"{first.get('world_size')} first"
        )
        _report(scoped, message)
        raise RendezvousError(message, rank=me["rank"], world_size=world_size)


def _claim_rank(scoped: ScopedStore, rank: int, claim: dict[str, Any]) -> None:
    mine = json.dumps(claim).encode()
    stored = scoped.compare_set(f"rdzv/rank/{rank}", None, mine)
    if stored != mine:
        message = f"rank {rank} is claimed twice: by {_who(json.loads(stored))} and {_who(claim)}"
        _report(scoped, message)
        raise RendezvousError(message, rank=rank)


def _report(scoped: ScopedStore, message: str) -> None:
    """Leave the first error where waiting ranks look, so they fail now, not at a timeout."""
    scoped.compare_set(ERROR_KEY, None, message.encode())
