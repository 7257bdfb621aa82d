"""`cclctl launch`: run a command as N local ranks, the way torchrun does on one host."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from cclctl.commands.checks import check_command
from cclctl.commands.launch_verdict import FailureWatch, verdict_line
from cclctl.commands.launch_waiting import WaitWatch
from cclctl.config import runtime_from_env
from cclctl.errors import UsageError
from cclctl.launch import streaming_copies
from cclctl.launch.launcher import MAX_PROCS, launch, print_prefixed
from cclctl.launch.output import where_to_watch
from cclctl.store.backends import is_etcd

HELP = (
    "Run CMD as N ranks on this host, around a job store, and stop them all together.\n\n"
    "Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and "
    "MASTER_PORT (as torchrun sets them), plus CCLCTL_STORE, CCLCTL_JOB and CCLCTL_TOKEN, so "
    "cclctl.init() and torch.distributed's env:// both work unchanged. Output lines are "
    "prefixed with \\[rank k]; stderr stays on stderr.\n\n"
    f"Copies of {streaming_copies.DEFAULT_BYTES >> 20} MiB or more in the ranks bypass the "
    "cache (GLIBC_TUNABLES sets glibc's "
    "non-temporal threshold, which virtual machines often leave at hundreds of MB); "
    "CCLCTL_STREAMING_COPY=SIZE moves it, CCLCTL_STREAMING_COPY=0 leaves glibc's own.\n\n"
    "When a rank exits non-zero or is killed, the launcher records it in the job's store "
    "(the ranks then name it in their errors), the others get SIGTERM, then SIGKILL after "
    "--grace seconds, and cclctl exits with that rank's code (1 if it died by a signal). "
    "The last line names the failure's origin, not the first rank to exit: the rank, its "
    "signal or exit code, the collective, what became of the others and where the dumps "
    "are (CCLCTL_TRACE_DIR, else the job's folder); for a hang, the rank the others wait on. "
    "While ranks that finished wait on ranks still running, it says which, and what they "
    "are doing (stopped, in which call, how far behind), every CCLCTL_STATUS_INTERVAL "
    "seconds while that changes. "
    "At start it prints the store's address and the `cclctl top` and `cclctl diagnose hang` "
    "commands that watch this job, on stderr. "
    "The job's store is the launcher's own, a process that lingers a while after the job; "
    "with CCLCTL_STORE=etcd://HOST:PORT,... in the environment it is that etcd cluster "
    "instead (no store process is started, and --port has no use). "
    f"Ctrl-C is forwarded to every rank before they are stopped the same way. -n is 1 to "
    f"{MAX_PROCS}."
)

EPILOG = """Examples:

  cclctl launch -n 4 -- python train.py --epochs 1

  cclctl launch -n 8 --timeout 600 -- cclctl bench --collective all_reduce -e 1G

Equivalents elsewhere (same variables, same script):

  torchrun --standalone --nproc-per-node 4 train.py --epochs 1

  srun --ntasks 4 --nodes 1 python train.py --epochs 1

  mpirun -np 4 python train.py --epochs 1
"""


def register(app: typer.Typer) -> None:
    app.command(
        "launch",
        help=HELP,
        epilog=EPILOG,
        context_settings={"allow_interspersed_args": False},
    )(launch_command)


def launch_command(
    cmd: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="-- CMD ARGS", help="The command each rank runs.", show_default=False
        ),
    ] = None,
    nprocs: int = typer.Option(1, "-n", "--nprocs", help="How many ranks to start."),
    port: int = typer.Option(
        0, "--port", help="Port of the job's store on 127.0.0.1 (0: a free one)."
    ),
    timeout: float | None = typer.Option(
        None, "--timeout", help="Stop every rank after this many seconds (exit code 1)."
    ),
    grace: float = typer.Option(
        5.0, "--grace", help="Seconds between SIGTERM and SIGKILL when stopping ranks."
    ),
) -> None:
    check_command("launch", {"-n": nprocs, "--port": port, "--timeout": timeout, "--grace": grace})
    if port and is_etcd(os.environ.get("CCLCTL_STORE", "")):
        raise UsageError(
            "--port is the launcher's own store's; the job's store is the etcd cluster "
            "CCLCTL_STORE names: leave --port out"
        )
    watch, waits = FailureWatch(), WaitWatch()
    result = launch(
        cmd or [],
        nprocs,
        port=port,
        output=print_prefixed,
        grace_s=grace,
        timeout_s=timeout,
        on_start=_announce,
        on_failure=watch,
        on_wait=waits,
        wait_interval_s=runtime_from_env().status_interval_s,
    )
    if result.returncode != 0:
        print(verdict_line(result, watch.live, waiting=waits.waiting), file=sys.stderr)
        raise typer.Exit(result.returncode)


def _announce(store: str, job: str) -> None:
    for line in where_to_watch(store, job):
        print(line, file=sys.stderr)
    sys.stderr.flush()
