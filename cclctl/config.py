"""Configuration: flags > ``CCLCTL_*`` environment > defaults, resolved once.

This is the only module that reads the environment. Everything it returns is a frozen
dataclass that is passed down explicitly, so behaviour never changes behind a caller's back
and tests can build configurations without touching ``os.environ``.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from typing import TypeVar

from cclctl import config_rendezvous as rendezvous
from cclctl import config_values as values
from cclctl.config_rendezvous import RendezvousConfig

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 60.0
DEFAULT_TRACE_BUFFER = 2000
DEFAULT_STATUS_INTERVAL_S = 1.0
DEFAULT_SLOW_WINDOW_S = 5.0  # the slowness signals' window (cclctl/slow_signals.py)
TRANSPORTS = ("auto", "tcp")
HANG_POLICIES = ("raise", "abort", "wait")
DEFAULT_RETRY_BUDGET_S = 30.0  # CCLCTL_RETRY_BUDGET: seconds a link fault is retried
FAILURE_POLICIES = ("raise", "shrink")  # CCLCTL_ON_FAILURE: what a call does when a rank died
DEFAULT_STORE_MAX_FRAME = 64 << 20
DEFAULT_STORE_LINGER_S = 120.0
#: CCLCTL_STAGE: which tensors the relay stages through host memory (auto: non-CPU ones)
STAGE_POLICIES = ("auto", "always", "never")
#: When a host's ranks move plain buffers through each other's memory (CCLCTL_SHM_CMA)
CROSS_MEMORY_POLICIES = ("auto", "always", "never")
DEFAULT_STAGE_CHUNK = 4 << 20  # CCLCTL_STAGE_CHUNK: bytes per staging buffer
DEFAULT_STAGE_DEPTH = 4  # CCLCTL_STAGE_DEPTH: staging buffers in the relay's ring


@dataclasses.dataclass(frozen=True)
class StoreServerConfig:
    """How a store cclctl hosts listens: where (``CCLCTL_STORE_ADDR``; empty: the address
    the ranks are given), the largest request it takes (``CCLCTL_STORE_MAX_FRAME``) and, for
    the one rank 0 starts, how long it outlives the last rank (``CCLCTL_STORE_LINGER``)."""

    bind: str = ""
    max_frame: int = DEFAULT_STORE_MAX_FRAME
    linger_s: float = DEFAULT_STORE_LINGER_S


def store_server_from_env(env: Mapping[str, str] | None = None) -> StoreServerConfig:
    env = os.environ if env is None else env
    return StoreServerConfig(
        bind=values.parse(env, "CCLCTL_STORE_ADDR", "", values.bind_address),
        max_frame=values.parse(
            env, "CCLCTL_STORE_MAX_FRAME", DEFAULT_STORE_MAX_FRAME, values.frame_size
        ),
        linger_s=values.parse(
            env, "CCLCTL_STORE_LINGER", DEFAULT_STORE_LINGER_S, values.linger_seconds
        ),
    )


def in_launched_job(env: Mapping[str, str] | None = None) -> bool:
    """True when the environment names this process's rank (torchrun, Slurm, Open MPI)."""
    return rendezvous.launched(os.environ if env is None else env)


def rendezvous_from_env(env: Mapping[str, str] | None = None) -> RendezvousConfig:
    """Resolve rank, world size and the store address from the launcher's variables
    (:func:`cclctl.config_rendezvous.resolve`)."""
    return rendezvous.resolve(os.environ if env is None else env)


def attach_from_env(
    rank: int, world_size: int, env: Mapping[str, str] | None = None
) -> RendezvousConfig | None:
    """Where a job that already rendezvoused by other means (torch.distributed) finds
    cclctl's store (:func:`cclctl.config_rendezvous.attach`). None when no variable names it.
    """
    return rendezvous.attach(rank, world_size, os.environ if env is None else env)


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """Knobs of the communication runtime and its telemetry, for one process."""

    job: str = "default"
    timeout_s: float = DEFAULT_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    transport: str = "auto"
    algo: str = ""  # "" = choose by size; see runtime/comm/selection.py
    trace_buffer: int = DEFAULT_TRACE_BUFFER
    trace_dir: str = ""
    metrics_port: int = 0  # base port; 0 = no exporter
    host_metrics_port: int = 0  # the host agent's one endpoint for its ranks; 0 = none
    metrics_addr: str = "127.0.0.1"
    status_interval_s: float = DEFAULT_STATUS_INTERVAL_S
    slow_window_s: float = DEFAULT_SLOW_WINDOW_S
    on_hang: str = "raise"
    on_failure: str = "raise"  # "shrink": drop a dead rank and re-run the call
    retry_budget_s: float = DEFAULT_RETRY_BUDGET_S  # link faults retried this long; 0: off
    fault: str = ""
    token: str = ""  # the job's secret (see runtime/job/token.py): links and store prove it
    link_mac: bool = False  # a MAC on every TCP message (CCLCTL_LINK_MAC)
    debug: bool = False  # an uncaught cclctl error prints its traceback too (CCLCTL_DEBUG)
    stage: str = "auto"  # the relay (runtime/relay): "always" stages CPU tensors too
    stage_chunk: int = DEFAULT_STAGE_CHUNK  # bytes per staging buffer (CCLCTL_STAGE_CHUNK)
    stage_depth: int = DEFAULT_STAGE_DEPTH  # staging buffers in the ring (CCLCTL_STAGE_DEPTH)
    hostname: str = dataclasses.field(default_factory=socket.gethostname)
    #: statuses go through the host's agent (runtime/hostagent); CCLCTL_HOST_AGENT, on by
    #: default for a job's ranks; a config built in code (thread ranks in one process) has none
    host_agent: bool = False
    #: ranks of one host move plain buffers through each other's memory where the kernel
    #: lets them (runtime/transport/shm/cross_memory.py; CCLCTL_SHM_CMA): "auto" where they
    #: do not outnumber the cores, "always", or "never"
    shm_cma: str = "auto"

    def replace(self, **changes: object) -> RuntimeConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def runtime_from_env(env: Mapping[str, str] | None = None, **flags: object) -> RuntimeConfig:
    """Build the runtime configuration: explicit ``flags`` win over ``CCLCTL_*`` variables."""
    env = os.environ if env is None else env
    base = RuntimeConfig(
        job=env.get("CCLCTL_JOB") or env.get("TORCHELASTIC_RUN_ID") or "default",
        timeout_s=values.parse(env, "CCLCTL_TIMEOUT", DEFAULT_TIMEOUT_S, values.positive_float),
        connect_timeout_s=values.parse(
            env, "CCLCTL_CONNECT_TIMEOUT", DEFAULT_CONNECT_TIMEOUT_S, values.positive_float
        ),
        transport=values.parse(env, "CCLCTL_TRANSPORT", "auto", values.choice(TRANSPORTS)),
        algo=env.get("CCLCTL_ALGO", "").strip(),
        trace_buffer=values.parse(
            env, "CCLCTL_TRACE_BUFFER", DEFAULT_TRACE_BUFFER, values.non_negative_int
        ),
        trace_dir=env.get("CCLCTL_TRACE_DIR", "").strip(),
        metrics_port=values.parse(env, "CCLCTL_METRICS_PORT", 0, values.port),
        host_metrics_port=values.parse(env, "CCLCTL_HOST_METRICS_PORT", 0, values.port),
        metrics_addr=env.get("CCLCTL_METRICS_ADDR", "").strip() or "127.0.0.1",
        status_interval_s=values.parse(
            env, "CCLCTL_STATUS_INTERVAL", DEFAULT_STATUS_INTERVAL_S, values.positive_float
        ),
        slow_window_s=values.parse(
            env, "CCLCTL_SLOW_WINDOW", DEFAULT_SLOW_WINDOW_S, values.slow_window
        ),
        on_hang=values.parse(env, "CCLCTL_ON_HANG", "raise", values.choice(HANG_POLICIES)),
        on_failure=values.parse(env, "CCLCTL_ON_FAILURE", "raise", values.choice(FAILURE_POLICIES)),
        retry_budget_s=values.parse(
            env, "CCLCTL_RETRY_BUDGET", DEFAULT_RETRY_BUDGET_S, values.non_negative_float
        ),
        fault=env.get("CCLCTL_FAULT", "").strip(),
        token=env.get("CCLCTL_TOKEN", "").strip(),
        link_mac=values.parse(env, "CCLCTL_LINK_MAC", False, values.flag),
        debug=values.parse(env, "CCLCTL_DEBUG", False, values.flag),
        stage=values.parse(env, "CCLCTL_STAGE", "auto", values.choice(STAGE_POLICIES)),
        stage_chunk=values.parse(
            env, "CCLCTL_STAGE_CHUNK", DEFAULT_STAGE_CHUNK, values.stage_chunk
        ),
        stage_depth=values.parse(
            env, "CCLCTL_STAGE_DEPTH", DEFAULT_STAGE_DEPTH, values.stage_depth
        ),
        host_agent=values.parse(env, "CCLCTL_HOST_AGENT", True, values.flag),
        shm_cma=values.parse(env, "CCLCTL_SHM_CMA", "auto", values.choice(CROSS_MEMORY_POLICIES)),
    )
    given = {k: v for k, v in flags.items() if v is not None}
    return base.replace(**given) if given else base


def client_token(env: Mapping[str, str] | None = None) -> str | None:
    """The token ``top`` and ``diagnose hang`` prove to a store (``CCLCTL_TOKEN``); None:
    they read without one, which a job's store allows for its statuses."""
    env = os.environ if env is None else env
    return env.get("CCLCTL_TOKEN", "").strip() or None


def job_dir(job: str, env: Mapping[str, str] | None = None) -> str:
    """The job's folder on this host, where its token file (and dumps) live:
    ``CCLCTL_TRACE_DIR`` when set, else ``${TMPDIR:-/tmp}/cclctl-<uid>/<job>/``: one per
    user, and never a folder named ``cclctl``, which Python run from ``/tmp`` would take for
    the package."""
    env = os.environ if env is None else env
    trace_dir = env.get("CCLCTL_TRACE_DIR", "").strip()
    if trace_dir:
        return trace_dir
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job).lstrip(".") or "_"
    return os.path.join(jobs_dir(env), safe)


def jobs_dir(env: Mapping[str, str] | None = None) -> str:
    """``${TMPDIR:-/tmp}/cclctl-<uid>/``: the folder that holds this user's job folders
    (``cclctl diagnose hang`` with no argument reads the newest job in it)."""
    env = os.environ if env is None else env
    return os.path.join(env.get("TMPDIR", "").strip() or "/tmp", f"cclctl-{os.getuid()}")


def trace_dir_from_env(env: Mapping[str, str] | None = None) -> str:
    """``CCLCTL_TRACE_DIR``, or empty: where the ranks of this environment dump."""
    env = os.environ if env is None else env
    return env.get("CCLCTL_TRACE_DIR", "").strip()


def bench_corrupt_from_env(env: Mapping[str, str] | None = None) -> str:
    """``CCLCTL_BENCH_CORRUPT``: the checker's self-test (see cclctl.benchmark.selftest).

    Returned raw; :meth:`cclctl.benchmark.selftest.Corruption.parse` validates it.
    """
    env = os.environ if env is None else env
    return env.get("CCLCTL_BENCH_CORRUPT", "").strip()


def environment() -> Mapping[str, str]:
    """This process's environment, read-only: what :mod:`cclctl.config_check` checks."""
    return os.environ


def inherited_environment() -> dict[str, str]:
    """A copy of this process's environment: what a launcher hands down to the ranks it starts.

    It lives here because this module is the only one that touches ``os.environ``.
    """
    return dict(os.environ)
