"""`cclctl run`: run a PyTorch job with cclctl's telemetry, without editing the script.

The command is exec'd (same pid, signals and exit code: a launcher watching this process
sees the job itself) with a folder first on PYTHONPATH whose ``sitecustomize`` instruments
torch.distributed when torch is imported. The variable is inherited, so every Python
process below is covered too: ``cclctl run -- torchrun ...`` instruments each worker
torchrun starts, and ``torchrun ... -m cclctl run -- train.py`` works as well.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from cclctl import config_values as values
from cclctl.commands.checks import check_command
from cclctl.config import (
    in_launched_job,
    inherited_environment,
    rendezvous_from_env,
    runtime_from_env,
)
from cclctl.config_rendezvous import attach_address
from cclctl.errors import ConfigError, UsageError
from cclctl.launch.output import where_to_watch

HELP = (
    "Run a PyTorch job with cclctl's counters, flight recorder, live status, metrics and "
    "hang watchdog on every torch.distributed collective, without editing the script.\n\n"
    "Each rank publishes its status to cclctl's store: the one `cclctl launch` runs, else "
    "one rank 0 hosts on MASTER_PORT+1 (rank 0 prints the `cclctl top` command to use). "
    "Where the store is known before the job starts (CCLCTL_STORE or MASTER_PORT set), the "
    "`cclctl top` and `cclctl diagnose hang` commands are printed on stderr at once.\n\n"
    "Every option and CCLCTL_* variable is checked before CMD starts: a bad one is exit "
    "code 2, and the job never runs uninstrumented by mistake. "
    "A CMD ending in .py runs with this Python.\n\n"
    "--backend cclctl runs a job that asks for gloo on cclctl's own runtime instead "
    "(shared memory on a host, TCP between hosts, a reset link retried), the script "
    "unedited: its calls are then the runtime's records."
)

EPILOG = """Examples:

  cclctl run -- python train.py --epochs 1

  cclctl run --trace-dir /tmp/traces -- torchrun --nproc-per-node 8 train.py

  cclctl run --backend cclctl -- torchrun --nproc-per-node 4 train_gloo.py

  torchrun --nproc-per-node 8 -m cclctl run -- train.py

  cclctl launch -n 4 -- cclctl run -- python train.py
"""


def register(app: typer.Typer) -> None:
    app.command(
        "run",
        help=HELP,
        epilog=EPILOG,
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    )(run_command)


def run_command(
    cmd: Annotated[
        list[str] | None,
        typer.Argument(metavar="-- CMD ARGS", help="The job to run.", show_default=False),
    ] = None,
    trace_dir: str | None = typer.Option(
        None,
        "--trace-dir",
        help="Where ranks write dumps (CCLCTL_TRACE_DIR) \\[default: the job's folder, "
        "${TMPDIR:-/tmp}/cclctl-<uid>/<job>/]. Every rank dumps there with no setup: on a "
        "hang, an uncaught error, an exit after errors, SIGTERM and kill -USR1.",
    ),
    timeout: float | None = typer.Option(
        None, "--timeout", help="Seconds before the watchdog calls a collective hung."
    ),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", help="Serve Prometheus metrics from this port + local rank."
    ),
    job: str | None = typer.Option(None, "--job", help="Job name in the store and dumps."),
    backend: str | None = typer.Option(
        None,
        "--backend",
        help="Run the job's groups on cclctl's runtime (CCLCTL_TORCH_BACKEND): 'cclctl' "
        "moves the groups the job puts on gloo (init_process_group('gloo'), or no backend "
        "on a host without a GPU); 'cpu:cclctl,cuda:cclctl' moves NCCL's too. A group "
        "moves whole or stays as the job asked (one warning).",
    ),
) -> None:
    argv = command_line(cmd or [])
    env = run_environment(
        inherited_environment(),
        CCLCTL_TRACE_DIR=trace_dir,
        CCLCTL_TIMEOUT=None if timeout is None else str(timeout),
        CCLCTL_METRICS_PORT=None if metrics_port is None else str(metrics_port),
        CCLCTL_JOB=job,
        CCLCTL_TORCH_BACKEND=backend,
    )
    check_command("run", {"--timeout": timeout, "--metrics-port": metrics_port}, env=env)
    check_backend(backend, env)
    _announce(env)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        raise UsageError(f"cclctl run: {argv[0]}: command not found") from None
    except PermissionError:
        raise UsageError(f"cclctl run: {argv[0]}: permission denied") from None


def _announce(env: dict[str, str]) -> None:
    """Where the job's store is known already, print it and the commands that watch the job
    (once per job: outside a launched job, or on its rank 0)."""
    where = attach_address(env)
    if where is None or (in_launched_job(env) and rendezvous_from_env(env).rank != 0):
        return
    host, port, _ = where
    store = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if values.is_etcd(env.get("CCLCTL_STORE", "")):
        store = env["CCLCTL_STORE"].strip()  # the cluster, every member, as ranks reach it
    for line in where_to_watch(store, runtime_from_env(env).job):
        print(line, file=sys.stderr)


def check_backend(backend: str | None, env: dict[str, str]) -> None:
    """``--backend`` (else an inherited CCLCTL_TORCH_BACKEND) is one the job can move onto:
    a usage error before the job starts, never a job left on gloo by a typo."""
    from cclctl.integrations.torch import backend_choice

    if backend is None:
        backend_choice.from_env(env)
        return
    try:
        backend_choice.parse(backend)
    except ValueError as exc:
        raise ConfigError(f"--backend {exc}", flag="--backend") from None


def command_line(cmd: list[str]) -> list[str]:
    """The command to exec: as given, with this Python in front of a bare ``script.py``."""
    if not cmd or not cmd[0]:
        raise UsageError("no command to run: give it after --, e.g. cclctl run -- python train.py")
    return [sys.executable, *cmd] if cmd[0].endswith(".py") else list(cmd)


def bootstrap_dir() -> str:
    """The folder whose ``sitecustomize`` instruments torch at start-up."""
    from cclctl.integrations import bootstrap

    return os.path.dirname(os.path.abspath(bootstrap.__file__))


def run_environment(base: dict[str, str], **settings: str | None) -> dict[str, str]:
    """``base`` with the bootstrap folder first on PYTHONPATH and the given CCLCTL_*
    settings (None: leave as inherited).
    """
    env = dict(base)
    here = bootstrap_dir()
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    env["PYTHONPATH"] = os.pathsep.join([here, *paths])
    env.update({name: value for name, value in settings.items() if value is not None})
    return env
