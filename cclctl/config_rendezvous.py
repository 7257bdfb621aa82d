"""Rendezvous settings: where a rank sits in its job and where the job's store lives.

Read from a launcher's variables (torchrun's, Slurm's, Open MPI's) in a mapping the caller
hands in: :mod:`cclctl.config`, the only module that reads the environment, resolves the
process's own and passes it here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from cclctl import config_values as values
from cclctl.errors import ConfigError

DEFAULT_STORE_PORT = 29500


@dataclasses.dataclass(frozen=True)
class RendezvousConfig:
    """Where this rank sits in the job and where the job's store lives.

    Read from torchrun's names first (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``), then Slurm's, then Open MPI's, so a
    script runs unchanged under torchrun, srun, mpirun or ``cclctl launch``.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    store_host: str
    store_port: int
    source: str  # which launcher's variables were used: torchrun, slurm, openmpi
    store_external: bool = False  # True: the store already runs (cclctl launch); don't host it
    store_url: str = ""  # CCLCTL_STORE=etcd://...: the cluster (store_host/port: its first)

    @property
    def store_address(self) -> str:
        """The store as the factory opens it (``store.backends.open_store``): the etcd
        cluster's ``etcd://...``, else ``HOST:PORT``."""
        if self.store_url:
            return self.store_url
        host = f"[{self.store_host}]" if ":" in self.store_host else self.store_host
        return f"{host}:{self.store_port}"


_RANK_SOURCES: tuple[tuple[str, str, str, str, str], ...] = (
    # (source, rank, world size, local rank, local world size)
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
    (
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
)


def _int_var(env: Mapping[str, str], name: str) -> int:
    raw = env[name]
    try:
        value = int(raw.split("(")[0])  # SLURM_NTASKS_PER_NODE may read "4(x2)"
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer", variable=name) from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r} must not be negative", variable=name)
    return value


def launched(env: Mapping[str, str]) -> bool:
    """True when ``env`` names this process's rank (torchrun, Slurm, Open MPI)."""
    return any(rank in env and size in env for _, rank, size, _, _ in _RANK_SOURCES)


def resolve(env: Mapping[str, str]) -> RendezvousConfig:
    """Resolve rank, world size and the store address from the launcher's variables."""
    for source, rank_var, size_var, local_var, local_size_var in _RANK_SOURCES:
        if rank_var not in env or size_var not in env:
            continue
        rank = _int_var(env, rank_var)
        world_size = _int_var(env, size_var)
        if world_size < 1:
            raise ConfigError(f"{size_var}={world_size} must be at least 1", variable=size_var)
        if rank >= world_size:
            raise ConfigError(
                f"{rank_var}={rank} is out of range for {size_var}={world_size}",
                variable=rank_var,
            )
        local_rank = _int_var(env, local_var) if local_var in env else 0
        local_size = _int_var(env, local_size_var) if local_size_var in env else 1
        host, port, external = _store_address(env)
        return RendezvousConfig(
            rank, world_size, local_rank, local_size, host, port, source, external, _etcd(env)
        )
    raise ConfigError(
        "cannot tell this process's rank: set RANK and WORLD_SIZE (with MASTER_ADDR and "
        "MASTER_PORT), or start it with `cclctl launch`, torchrun, srun or mpirun",
        variable="RANK",
    )


def _store_address(env: Mapping[str, str]) -> tuple[str, int, bool]:
    """The store's address: ``CCLCTL_STORE`` (host:port of a running store, as set by
    ``cclctl launch``; an etcd cluster's first member), else ``MASTER_ADDR``:``MASTER_PORT``
    where rank 0 hosts it.

    Under torchrun the agent may run PyTorch's own store on ``MASTER_PORT``, so cclctl's
    defaults to the port after it there.
    """
    given = env.get("CCLCTL_STORE", "").strip()
    if given and values.is_etcd(given):
        endpoints = values.parse(env, "CCLCTL_STORE", [("", 0)], values.etcd_endpoints)
        return endpoints[0][0], endpoints[0][1], True
    if given:
        host, port = values.parse(env, "CCLCTL_STORE", ("", 0), values.host_port)
        return host, port, True
    host = env.get("MASTER_ADDR") or _slurm_first_host(env) or "127.0.0.1"
    port = values.parse(env, "MASTER_PORT", DEFAULT_STORE_PORT, values.port)
    if "TORCHELASTIC_RUN_ID" in env and "MASTER_PORT" in env:
        port += 1
    return host, port, False


def attach(rank: int, world_size: int, env: Mapping[str, str]) -> RendezvousConfig | None:
    """Where a job that already rendezvoused by other means (torch.distributed) finds
    cclctl's store (see :func:`attach_address`). None when no variable names it.
    """
    where = attach_address(env)
    if where is None:
        return None
    host, port, external = where
    local_rank, local_size = 0, 1
    if launched(env):
        place = resolve(env)
        local_rank, local_size = place.local_rank, place.local_world_size
    return RendezvousConfig(
        rank, world_size, local_rank, local_size, host, port, "torch", external, _etcd(env)
    )


def _etcd(env: Mapping[str, str]) -> str:
    """``CCLCTL_STORE`` when it names an etcd cluster (the job's store is there), else ""."""
    given = env.get("CCLCTL_STORE", "").strip()
    return values.store_address(given) if given and values.is_etcd(given) else ""


def attach_address(env: Mapping[str, str]) -> tuple[str, int, bool] | None:
    """cclctl's store for a torch.distributed job: ``CCLCTL_STORE`` (running: join it), else
    ``MASTER_ADDR``:``MASTER_PORT`` + 1, hosted by rank 0, because torch.distributed's own
    store holds ``MASTER_PORT`` under torchrun and plain env:// alike. None when neither
    variable is set. The last item is True when the store already runs.
    """
    if env.get("CCLCTL_STORE", "").strip():
        return _store_address(env)
    if not env.get("MASTER_PORT", "").strip():
        return None
    host = env.get("MASTER_ADDR") or _slurm_first_host(env) or "127.0.0.1"
    port = values.parse(env, "MASTER_PORT", DEFAULT_STORE_PORT, values.port) + 1
    if port > 65535:
        raise ConfigError("MASTER_PORT=65535 leaves no port for cclctl's store")
    return host, port, False


def _slurm_first_host(env: Mapping[str, str]) -> str | None:
    """First host of a simple Slurm node list (``node[01-04]`` -> ``node01``)."""
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not nodes:
        return None
    head = nodes.split(",")[0]
    if "[" in head:
        prefix, rest = head.split("[", 1)
        first = rest.split("-")[0].split(",")[0].rstrip("]")
        return prefix + first
    return head
