"""Up-front checks: every option and ``CCLCTL_*`` variable a command will use, before it
starts a rank or a child.

Each command calls :func:`preflight` first, so a bad value is one line naming it and exit
code 2 at once, never a job that runs misconfigured or uninstrumented, or ranks that each
fail alone. The values are judged by the same converters :mod:`cclctl.config` resolves them
with, so an option and its variable are held to the same rule.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping

from cclctl import config_values as values
from cclctl.config import (
    environment,
    in_launched_job,
    rendezvous_from_env,
    runtime_from_env,
    store_server_from_env,
)
from cclctl.config_rendezvous import attach_address
from cclctl.errors import ConfigError

#: Ranks one ``cclctl launch`` starts, at most.
MAX_LOCAL_RANKS = 1024

#: Every variable cclctl reads, and what it is for (the unknown-name hint draws on it).
VARIABLES: dict[str, str] = {
    "CCLCTL_JOB": "job name in the store, dumps and metrics",
    "CCLCTL_STORE": "HOST:PORT of a running job store, or etcd://HOST:PORT,... (etcd)",
    "CCLCTL_TOKEN": "the job's secret, proved by links and the store (set by cclctl launch)",
    "CCLCTL_LINK_MAC": "1: a MAC on every TCP message between ranks",
    "CCLCTL_STORE_ADDR": "address the store rank 0 hosts listens on",
    "CCLCTL_STORE_MAX_FRAME": "largest store request, in bytes (64M)",
    "CCLCTL_STORE_LINGER": "seconds rank 0's store outlives the last rank (120)",
    "CCLCTL_TIMEOUT": "seconds before a collective counts as hung",
    "CCLCTL_CONNECT_TIMEOUT": "seconds to reach the store and peers",
    "CCLCTL_TRANSPORT": "auto or tcp",
    "CCLCTL_ALGO": "algorithm choices per collective",
    "CCLCTL_TRACE_BUFFER": "flight-recorder records kept",
    "CCLCTL_TRACE_DIR": "where dumps are written",
    "CCLCTL_METRICS_PORT": "base port of the Prometheus exporter",
    "CCLCTL_METRICS_ADDR": "address the exporter listens on",
    "CCLCTL_HOST_METRICS_PORT": "port of the host agent's one Prometheus endpoint for its ranks",
    "CCLCTL_STATUS_INTERVAL": "seconds between live status updates",
    "CCLCTL_HOST_AGENT": "1 (default): statuses go to the store through one agent per host",
    "CCLCTL_SHM_CMA": "auto, always or never: whether a host's ranks copy plain buffers "
    "through each other's memory (auto: where they do not outnumber the cores)",
    "CCLCTL_SLOW_WINDOW": "seconds per window of the slowness signals (5)",
    "CCLCTL_ON_HANG": "raise, abort or wait",
    "CCLCTL_ON_FAILURE": "raise or shrink (drop a dead rank, re-run the call)",
    "CCLCTL_RETRY_BUDGET": "seconds a broken link is retried (30; 0: off)",
    "CCLCTL_FAULT": "injected faults",
    "CCLCTL_DEBUG": "1: a rank's uncaught cclctl error prints its traceback too",
    "CCLCTL_STAGE": "auto, always or never: which tensors the relay stages through host memory",
    "CCLCTL_STAGE_CHUNK": "bytes per relay staging buffer (4M)",
    "CCLCTL_STAGE_DEPTH": "relay staging buffers in the ring (4)",
    "CCLCTL_TORCH_BACKEND": "cclctl or cpu:cclctl,cuda:cclctl: groups cclctl run moves to cclctl",
    "CCLCTL_STREAMING_COPY": "copy size that bypasses the cache in launched ranks",
    "CCLCTL_BENCH_CORRUPT": "bench's checker self-test",
}

#: Commands that only read a store use CCLCTL_STORE alone; the others start processes that
#: inherit the environment, so everything those read is checked, except what the launcher
#: replaces (its own store and token).
_CLIENT_COMMANDS = ("top", "diagnose hang", "diagnose slow", "abort", "retry")
_REPLACED_BY_LAUNCHER = ("CCLCTL_STORE", "CCLCTL_TOKEN")

#: Rules of the options that carry a number; ``None`` means not given.
_OPTION_RULES: dict[str, Callable[[str], object]] = {
    "--timeout": values.positive_float,
    "--grace": values.non_negative_float,
    "--metrics-port": values.port,
    "--port": values.port,
    "--store": values.store_address,
}

#: Parses a structured variable's value (their parsers live in the layers above).
Parser = Callable[[str], object]


@dataclasses.dataclass(frozen=True)
class Preflight:
    """What the checks found: the store a client command reads, and warnings to print."""

    command: str
    store: str | None = None  # top, diagnose hang: --store, else CCLCTL_STORE
    warnings: tuple[str, ...] = ()


def preflight(
    command: str,
    options: Mapping[str, object] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    parsers: Mapping[str, Parser] | None = None,
) -> Preflight:
    """Check ``options`` (flag -> value, None when not given) and the variables ``command``
    will use; raise :class:`ConfigError` naming the first bad one.

    ``parsers`` check the structured variables (``CCLCTL_ALGO``, ``CCLCTL_FAULT``, ...).
    """
    env = environment() if env is None else env
    options = options or {}
    for flag, value in options.items():
        check_option(flag, value)
    warnings = tuple(unknown_variables(env)) if _speaks(env) else ()
    if command in _CLIENT_COMMANDS:
        store = options.get("--store")
        given = store if isinstance(store, str) else None
        return Preflight(command, store_address(given, env), warnings)
    checked = dict(env)
    if command == "run":
        attach_address(env)  # MASTER_PORT too: where the job's store will be
    elif command == "bench" and in_launched_job(env):
        rendezvous_from_env(env)  # this process is a rank: the job's store, rank, size
    else:  # bench (bare) and launch start ranks around a store of their own
        for name in _REPLACED_BY_LAUNCHER:
            checked.pop(name, None)
    check_variables(checked, parsers or {})
    return Preflight(command, None, warnings)


def check_option(flag: str, value: object) -> None:
    """A numeric option's value, by the rule of its variable; unknown flags pass."""
    if flag == "-n":
        if isinstance(value, int) and not 1 <= value <= MAX_LOCAL_RANKS:
            raise ConfigError(
                f"-n {value} is not valid: the number of ranks is 1 to {MAX_LOCAL_RANKS}",
                flag=flag,
            )
        return
    rule = _OPTION_RULES.get(flag)
    if value is None or rule is None:
        return
    text = f"{value:g}" if isinstance(value, float) else str(value)
    try:
        rule(text.strip())
    except ValueError as exc:
        shown = repr(value) if isinstance(value, str) else text
        raise ConfigError(f"{flag} {shown} is not valid: {exc}", flag=flag) from None


def check_variables(env: Mapping[str, str], parsers: Mapping[str, Parser]) -> None:
    """Every ``CCLCTL_*`` variable in ``env`` parses (typed ones here, the rest by
    ``parsers``)."""
    runtime_from_env(env)
    store_server_from_env(env)
    if env.get("CCLCTL_STORE", "").strip():
        values.parse(env, "CCLCTL_STORE", "", values.store_address)
    for name, parse in parsers.items():
        raw = env.get(name, "").strip()
        if raw:
            parse(raw)


def store_address(given: str | None, env: Mapping[str, str]) -> str | None:
    """The store a client command reads: ``--store``, else ``CCLCTL_STORE``, checked as
    ``HOST:PORT`` or ``etcd://HOST:PORT,...``; None when neither is given."""
    if given is not None:
        check_option("--store", given)
        return given.strip()
    if not env.get("CCLCTL_STORE", "").strip():
        return None
    values.parse(env, "CCLCTL_STORE", "", values.store_address)
    return env["CCLCTL_STORE"].strip()


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """One warning per ``CCLCTL_*`` name cclctl does not read, with the closest known one."""
    found = []
    for name in sorted(n for n in env if n.startswith("CCLCTL_") and n not in VARIABLES):
        close = difflib.get_close_matches(name, VARIABLES, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        found.append(f"{name} is not a cclctl variable and is ignored{hint}")
    return found


def _speaks(env: Mapping[str, str]) -> bool:
    """Only one process of a job warns: the one outside it, or its rank 0."""
    if not in_launched_job(env):
        return True
    try:
        return rendezvous_from_env(env).rank == 0
    except ConfigError:
        return True
