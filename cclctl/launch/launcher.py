"""Start N local ranks around the job's store, follow them, and leave no rank behind.

This module sets the job up (its store, token and every rank's environment);
:mod:`~cclctl.launch.ranks` starts, watches and stops the rank processes. A launcher that is
killed outright (``kill -9``) takes its ranks with it: each rank starts behind
:mod:`~cclctl.launch.child_guard`, which has the kernel SIGKILL it when the launcher goes.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from cclctl import auth
from cclctl.config import inherited_environment, job_dir, store_server_from_env
from cclctl.config_check import MAX_LOCAL_RANKS
from cclctl.errors import StoreError, UsageError
from cclctl.launch import streaming_copies
from cclctl.launch.outcome import LaunchResult, RankExit, Waiting
from cclctl.launch.output import LineSink
from cclctl.launch.ranks import FailureHook, RankJob, WaitHook
from cclctl.launch.witness import StoreSeen, Witness
from cclctl.runtime.job.store_process import DetachedStore, spawn_store
from cclctl.store.backends import is_etcd
from cclctl.store.linger import FIRST_RANK_S

__all__ = [
    "MAX_PROCS",
    "FailureHook",
    "LaunchResult",
    "RankExit",
    "StoreSeen",
    "WaitHook",
    "Waiting",
    "launch",
    "print_prefixed",
]

MAX_PROCS = MAX_LOCAL_RANKS


def print_prefixed(rank: int, stream: str, line: str) -> None:
    """The default sink: ``[rank k] line`` on the launcher's stdout or stderr."""
    out = sys.stderr if stream == "stderr" else sys.stdout
    out.write(f"[rank {rank}] {line}\n")
    out.flush()


def launch(
    cmd: Sequence[str],
    nprocs: int,
    *,
    port: int = 0,
    env: Mapping[str, str] | None = None,
    output: LineSink | None = None,
    capture_rank0_stdout: Callable[[str], None] | None = None,
    grace_s: float = 5.0,
    timeout_s: float | None = None,
    on_start: Callable[[str, str], None] | None = None,
    on_failure: FailureHook | None = None,
    on_wait: WaitHook | None = None,
    wait_interval_s: float = 1.0,
) -> LaunchResult:
    """Run ``cmd`` as ``nprocs`` ranks on this host and wait for all of them.

    ``env`` adds variables to the inherited environment. Each rank also gets RANK,
    WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a free port for
    frameworks that host their own store), CCLCTL_STORE (this launcher's store; where the
    launcher's own environment has ``CCLCTL_STORE=etcd://...``, that etcd cluster, and no
    store process is started),
    CCLCTL_JOB and CCLCTL_TOKEN (a fresh token, also written 0600 to the job's folder for
    the operators on this host, and removed when the job ends), and GLIBC_TUNABLES names a
    streaming-copy threshold (see :mod:`~cclctl.launch.streaming_copies`). Lines go to
    ``output`` (default: ``[rank k] line``).
    ``on_start(store_address, job)`` is called once every rank started, before any rank's
    output is passed on (so its lines come first).

    The launcher is the first witness of a rank's death: when a rank dies of a signal or
    exits non-zero while the job runs, it writes the job's revoke record (``died``, the
    signal or exit code; unless a rank wrote one first), calls ``on_failure`` with that
    rank and what the store holds (also when ``timeout_s`` runs out, with None), and then
    stops the others. The result carries the order of the exits and the store's last word.
    While ranks that exited 0 wait on others still running, ``on_wait`` is called every
    ``wait_interval_s`` with those ranks and what the store holds.
    """
    _check_arguments(cmd, nprocs, port, grace_s, timeout_s)
    base = streaming_copies.rank_environment({**inherited_environment(), **(env or {})})
    token = auth.new_token()  # the job's: only its ranks may write to its store
    job_name = base.get("CCLCTL_JOB") or f"launch-{secrets.token_hex(4)}"
    token_file = _write_token(job_name, token, base)
    etcd = base.get("CCLCTL_STORE", "")
    store = None if is_etcd(etcd) else _spawn_store(port, token, job_name, token_file)
    address = etcd if store is None else store.address
    envs = _rank_environments(base, nprocs, address, token, job_name)
    witness = Witness(address, token, job_name)
    try:
        job = RankJob(list(cmd), nprocs, envs, witness, on_failure, on_wait, wait_interval_s)
        sink = _route(output or print_prefixed, capture_rank0_stdout)
        return job.run(sink, grace_s, timeout_s, on_start)
    finally:
        witness.close()  # the store lingers for top and diagnose, then leaves by itself
        if store is not None:
            store.close()
        with contextlib.suppress(OSError):
            token_file.unlink()
            token_file.parent.rmdir()  # only when the job left nothing else there


def _spawn_store(port: int, token: str, job: str, token_file: Path) -> DetachedStore:
    """The job's own store, a process of its own that lingers after the job."""
    try:
        return spawn_store(
            "127.0.0.1", port, token, store_server_from_env(), job=job,
            folder=str(token_file.parent), first_rank_s=FIRST_RANK_S,
        )  # fmt: skip
    except StoreError as exc:
        token_file.unlink()
        raise UsageError(f"{exc}; pick another --port, or 0 for a free one") from None


def _write_token(job: str, token: str, env: Mapping[str, str]) -> Path:
    """The job's token in its folder (0600), for ``cclctl top`` and the like on this host."""
    folder = job_dir(job, env)
    try:
        return auth.write_token_file(folder, token)
    except OSError as exc:
        raise UsageError(
            f"cannot write the job's token file in {folder}: {exc.strerror or exc} "
            "(set CCLCTL_TRACE_DIR or TMPDIR to a folder of yours)"
        ) from None


def _check_arguments(
    cmd: Sequence[str], nprocs: int, port: int, grace_s: float, timeout_s: float | None
) -> None:
    if not cmd or not cmd[0]:
        raise UsageError(
            "no command to launch: give it after --, e.g. cclctl launch -n 2 -- python train.py"
        )
    if not 1 <= nprocs <= MAX_PROCS:
        raise UsageError(f"the number of ranks must be between 1 and {MAX_PROCS}, not {nprocs}")
    if not 0 <= port <= 65535:
        raise UsageError(f"port {port} is not a TCP port (0-65535; 0 picks a free one)")
    if grace_s < 0:
        raise UsageError(f"the grace period must not be negative, not {grace_s:g}s")
    if timeout_s is not None and timeout_s <= 0:
        raise UsageError(f"the timeout must be a positive number of seconds, not {timeout_s:g}")


def _rank_environments(
    base: dict[str, str], nprocs: int, store: str, token: str, job: str
) -> list[dict[str, str]]:
    common = {
        **base,
        "WORLD_SIZE": str(nprocs),
        "LOCAL_WORLD_SIZE": str(nprocs),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "CCLCTL_STORE": store,
        "CCLCTL_JOB": job,
        "CCLCTL_TOKEN": token,
        "PYTHONUNBUFFERED": base.get("PYTHONUNBUFFERED", "1"),  # lines as they are printed
    }
    return [dict(common, RANK=str(r), LOCAL_RANK=str(r)) for r in range(nprocs)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _route(output: LineSink, rank0_stdout: Callable[[str], None] | None) -> LineSink:
    if rank0_stdout is None:
        return output

    def sink(rank: int, stream: str, line: str) -> None:
        if rank == 0 and stream == "stdout":
            rank0_stdout(line)
        else:
            output(rank, stream, line)

    return sink
