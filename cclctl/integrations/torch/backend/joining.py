"""How a ``cclctl`` process group gets its communicator: the job's world, or a group of it.

torch hands the backend's creator its c10d store, the rank, the size and a timeout, after
its own rendezvous lined the ranks up. The group joins cclctl's job the way cclctl's
runtime does (``cclctl.init()``: the job's store, its token, rank claims, the transport),
at the store address a torch job already has for cclctl: ``CCLCTL_STORE`` (``cclctl
launch``), else ``MASTER_ADDR``:``MASTER_PORT + 1``, hosted by rank 0 (torchrun and env://
set both; :func:`cclctl.config.attach_from_env`). That is the simplest robust way: one
rendezvous and one token scheme for every front end, the store ``cclctl top --store`` and
the torch wrapper already use, nothing written to torch's store (which carries no auth).
Only where neither variable is set (a ``tcp://`` init) the address comes from torch's own
TCPStore (its host, its port + 1); a ``file://`` init without them is refused, saying what
to set.

A ``new_group`` is a sub-communicator (:mod:`cclctl.runtime.job.subgroup`): its members
meet in the same store under the group's torch name, open a transport among themselves
and run on it; its id is ``<torch group name>:<members>``, as the torch wrapper names
groups. It needs the world joined first, as torch does.
"""

from __future__ import annotations

from typing import Any

from cclctl.config import attach_from_env, runtime_from_env
from cclctl.config_rendezvous import RendezvousConfig
from cclctl.errors import ConfigError, UsageError
from cclctl.runtime.comm.communicator import Communicator
from cclctl.runtime.job.init import init_at
from cclctl.runtime.job.subgroup import open_subgroup

#: this process's world communicator and where its job's store is (for its groups)
_world: tuple[Communicator, str] | None = None


def communicator(opts: Any) -> Communicator:
    """The communicator of the group torch is creating (``opts``: torch's
    ``_DistributedBackendOptions``): the job's world, or a sub-communicator of it."""
    global _world
    members = [int(r) for r in opts.global_ranks_in_group]
    if members:
        if _world is None or _world[0].failure.closed:
            raise UsageError(
                f"new_group(ranks={members}, backend='cclctl'): the default group is not on "
                "the cclctl backend; a cclctl group is a sub-communicator of its world",
                ranks=members,
            )
        return open_subgroup(_world[0], _world[1], members, str(opts.group_id))
    rank, size = int(opts.group_rank), int(opts.group_size)
    where = attach_from_env(rank, size) or _beside_torch_store(rank, size, opts.store)
    comm = init_at(where, runtime_from_env())
    _world = (comm, where.store_address)
    return comm


def _beside_torch_store(rank: int, size: int, store: Any) -> RendezvousConfig:
    """cclctl's store on the port after torch's TCPStore (rank 0 hosts it)."""
    while hasattr(store, "underlying_store"):  # torch's per-group prefixes
        store = store.underlying_store
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if not host or not port:
        raise ConfigError(
            "the cclctl backend finds cclctl's store from MASTER_ADDR and MASTER_PORT "
            f"(torchrun and env:// set them) or CCLCTL_STORE; torch's store here is a "
            f"{type(store).__name__}, which has no address: set MASTER_ADDR and MASTER_PORT",
            variable="MASTER_PORT",
        )
    return RendezvousConfig(rank, size, 0, 1, str(host), int(port) + 1, "torch")
