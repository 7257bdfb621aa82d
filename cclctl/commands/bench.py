"""`cclctl bench`: an nccl-tests-style bandwidth sweep with per-element correctness checks.

Run bare, it spawns ``-g`` local ranks (``python -m cclctl.benchmark.worker``) and follows
rank 0's streamed rows. Inside a launched job (torchrun, srun, mpirun,
``cclctl launch -- cclctl bench``) every rank runs the sweep itself and rank 0 reports.
Either way each row reaches the table (stdout) and the files as soon as it is measured, a
Ctrl-C keeps the rows so far and exits 130, and a failed check exits 4.
"""

from __future__ import annotations

import sys

import typer

import cclctl
from cclctl.benchmark import events, report
from cclctl.benchmark.options import STAGING_BACKENDS, BenchOptions, build_options
from cclctl.benchmark.outputs import Outputs
from cclctl.benchmark.results import Row, RunMeta, now_iso
from cclctl.commands.checks import check_command
from cclctl.config import in_launched_job, inherited_environment, rendezvous_from_env
from cclctl.errors import CclError

#: The job name of a bare run's ranks unless CCLCTL_JOB says otherwise: stable, so the
#: metrics' job label keeps one value from run to run.
DEFAULT_JOB = "bench"

HELP = (
    "Measure collective bandwidth and check every result, like nccl-tests' *_perf.\n\n"
    "Sweeps sizes from -b to -e (multiplying by -f), out-of-place and in-place, and prints "
    "nccl-tests' table: size, count, type, redop, root, then time (us), algbw and busbw "
    "(GB/s) and #wrong for each placement, and the average bus bandwidth. Each row is printed, "
    "and written to --csv and -J/--json, as soon as it is measured; Ctrl-C stops the ranks, "
    "keeps the rows so far (the files stay valid) and exits 130. Exit code 4 when any "
    "element is wrong or an op's average busbw is under --min-busbw.\n\n"
    "Flags mean what they mean in nccl-tests' all_reduce_perf: -n iterations, -w warm-up "
    "iterations, -o the reduction, -d the data type, -a how ranks' times combine, -T the "
    "timeout, -J the JSON file. The collectives are chosen with --collective (not -o/--op, "
    "which is the reduction).\n\n"
    "'-' as --csv or -J/--json writes that format to stdout; the table then goes to stderr, "
    "so stdout stays parseable (only one of them may be '-').\n\n"
    "Run bare, it spawns -g local ranks under the job name 'bench' (or CCLCTL_JOB); inside a "
    "launched job (torchrun, srun, mpirun, cclctl launch) every rank runs the sweep and rank "
    "0 reports.\n\n"
    "Self-test of the checker: CCLCTL_BENCH_CORRUPT=RANK[:OP[:SIZE]] makes that rank corrupt "
    "one element of each result it checks, which must show up as #wrong and exit code 4."
)


def register(app: typer.Typer) -> None:
    app.command("bench", help=HELP)(bench)


# The options of ``cclctl bench``, nccl-tests' flags where it has them.
_COLLECTIVE = typer.Option(
    "all_reduce",
    "--collective",
    "--coll",
    help="Collective(s), comma separated: all_reduce, all_gather, reduce_scatter, "
    "broadcast, reduce, alltoall, sendrecv (nccl-tests has one binary per collective). "
    "Not -o/--op, which is the reduction: an old '--op all_reduce' is refused.",
)
_NRANKS = typer.Option(
    2,
    "-g",
    "--nranks",
    help="Local ranks to spawn, one process each (nccl-tests' -g, GPUs per thread, is the "
    "nearest meaning; no -N, which is nccl-tests' run cycles). Ignored inside a launched "
    "job.",
)
_MINBYTES = typer.Option("8", "-b", "--minbytes", help="Smallest size: 8, 1K, 64M, 1G.")
_MAXBYTES = typer.Option("64M", "-e", "--maxbytes", help="Largest size.")
_STEPFACTOR = typer.Option(2, "-f", "--stepfactor", help="Size multiplier per step.")
_ITERS = typer.Option(
    None, "-n", "--iters", help="Timed iterations per size (default: 20, fewer for big sizes)."
)
_WARMUP_ITERS = typer.Option(
    None,
    "-w",
    "--warmup_iters",
    "--warmup-iters",
    help="Untimed iterations per size (default: up to 5).",
)
_REDOP = typer.Option(
    None,
    "-o",
    "--op",
    "--redop",
    help="Reduction of the reducing collectives: sum, prod, min, max, avg (default: sum).",
)
_DTYPE = typer.Option(
    "float32",
    "-d",
    "--datatype",
    "--dtype",
    help="float32 (float), float16 (half), bfloat16, float64 (double), int8, uint8, int32, int64.",
)
_ROOT = typer.Option(0, "-r", "--root", help="Root rank of broadcast and reduce.")
_CHECK = typer.Option(1, "-c", "--check", help="1: check every element; 0: skip.")
_AVERAGE = typer.Option(
    1,
    "-a",
    "--average",
    help="A row's time from the ranks' times: 0 rank 0's, 1 their average, 2 the "
    "minimum, 3 the maximum (nccl-tests' modes and default).",
)
_TIMEOUT = typer.Option(
    None,
    "-T",
    "--timeout",
    help="Seconds one collective may take before the run fails (default: CCLCTL_TIMEOUT, else 60).",
)
_JSON_PATH = typer.Option(
    None,
    "-J",
    "--json",
    help="Write the JSON report to PATH, rewritten after every row ('-': to stdout at "
    "the end, the table to stderr).",
)
_CSV_PATH = typer.Option(
    None,
    "--csv",
    help="Write the rows as CSV to PATH, a line per row ('-': to stdout, the table to stderr).",
)
_MIN_BUSBW = typer.Option(
    None, "--min-busbw", help="Fail (exit 4) when an op's average busbw (GB/s) is below."
)
_METRICS_PORT = typer.Option(
    None, "--metrics-port", help="Serve Prometheus metrics from this base port per rank."
)
_BACKEND = typer.Option(
    "cclctl",
    "--backend",
    help="cclctl (this runtime), or torch.distributed: torch (nccl with CUDA, else gloo), "
    "gloo, nccl, torch-cclctl (torch.distributed's cclctl backend: this runtime behind "
    "torch's API, as a PyTorch job runs on it).",
)
_STAGE = typer.Option(
    None,
    "--stage",
    help="auto, always or never: sets CCLCTL_STAGE for the ranks (default: CCLCTL_STAGE, "
    "else auto). 'always' stages every call through the relay (device -> host staging -> "
    "host collective -> device, chunked and pipelined); with --backend cclctl the table, "
    "JSON and CSV then add per placement the d2h, collective and h2d time per call and "
    "relay_efficiency (busbw / slowest stage's bandwidth, 1.0 at best). The buffers here "
    "are host memory: a copy thread stands in for a device's copy engine, so 'always' "
    "measures the relay's pipeline itself. 'auto' and 'never' leave host buffers unstaged. "
    "Only for --backend cclctl and torch-cclctl (which relays inside, without the columns).",
)
_SHARED_BUFFERS = typer.Option(
    False,
    "--shared-buffers",
    help="Allocate the buffers with comm.empty(): ranks on one host then read each "
    "other's buffers directly (zero-copy), as nccl-tests' -R registers them.",
)


def bench(
    collective: str = _COLLECTIVE,
    nranks: int = _NRANKS,
    minbytes: str = _MINBYTES,
    maxbytes: str = _MAXBYTES,
    stepfactor: int = _STEPFACTOR,
    iters: int | None = _ITERS,
    warmup_iters: int | None = _WARMUP_ITERS,
    redop: str | None = _REDOP,
    dtype: str = _DTYPE,
    root: int = _ROOT,
    check: int = _CHECK,
    average: int = _AVERAGE,
    timeout: float | None = _TIMEOUT,
    json_path: str | None = _JSON_PATH,
    csv_path: str | None = _CSV_PATH,
    min_busbw: float | None = _MIN_BUSBW,
    metrics_port: int | None = _METRICS_PORT,
    backend: str = _BACKEND,
    shared_buffers: bool = _SHARED_BUFFERS,
    stage: str | None = _STAGE,
) -> None:
    """Run the sweep (see HELP): spawned local ranks, or this rank of a launched job."""
    opts = build_options(
        collective=collective,
        minbytes=minbytes,
        maxbytes=maxbytes,
        stepfactor=stepfactor,
        warmup_iters=warmup_iters,
        iters=iters,
        dtype=dtype,
        redop=redop,
        root=root,
        check=check,
        min_busbw=min_busbw,
        command=["cclctl", *sys.argv[1:]],
        backend=backend,
        shared_buffers=shared_buffers,
        average=average,
        timeout_s=timeout,
        stage=stage,
    )
    check_command("bench", {"--metrics-port": metrics_port})  # before any rank starts
    paths = (json_path, csv_path)
    if in_launched_job():
        meta, rows = _run_here(opts, metrics_port, *paths)
    else:
        meta, rows = _spawn(opts, nranks, metrics_port, *paths)
    if meta is not None:  # rank 0 (only it reports)
        report.raise_on_failure(meta, rows)


def _provisional(opts: BenchOptions, world_size: int) -> RunMeta:
    """What an early JSON file says before rank 0 has described the run."""
    return RunMeta(world_size, (), opts.backend, cclctl.__version__, opts.to_dict(), now_iso())


def _run_here(
    opts: BenchOptions, metrics_port: int | None, json_path: str | None, csv_path: str | None
) -> tuple[RunMeta | None, list[Row]]:
    """Inside a launched job: this process is one rank; rank 0 writes the outputs, which it
    opens before joining, so a bad path fails before the sweep. Others return (None, [])."""
    from cclctl.benchmark.worker import RankSweep  # the runtime and numpy: not for every CLI start

    flags = {} if metrics_port is None else {"metrics_port": metrics_port}
    place = rendezvous_from_env()
    outputs = None
    if place.rank == 0:
        outputs = Outputs(json_path, csv_path, _provisional(opts, place.world_size))
    meta: RunMeta | None = None
    complete = False
    try:
        with RankSweep(opts, **flags) as job:
            meta = job.meta
            for row in job.rows():
                if outputs is not None:
                    outputs.row(meta, row)
            meta, complete = meta.finished(now_iso()), True
    finally:
        if outputs is not None:
            outputs.close(meta, complete)
    return (meta, outputs.rows) if outputs is not None else (None, [])


def _spawn(
    opts: BenchOptions,
    nranks: int,
    metrics_port: int | None,
    json_path: str | None,
    csv_path: str | None,
) -> tuple[RunMeta | None, list[Row]]:
    """Bare: open the outputs, start ``nranks`` local ranks, and pass each of rank 0's rows
    on as it arrives; what arrived is kept however the run ends."""
    from cclctl.launch.launcher import launch

    opts.check_world(nranks)
    outputs = Outputs(json_path, csv_path, _provisional(opts, nranks))  # before any rank
    env = {"CCLCTL_JOB": inherited_environment().get("CCLCTL_JOB") or DEFAULT_JOB}
    if metrics_port is not None:
        env["CCLCTL_METRICS_PORT"] = str(metrics_port)
    if opts.backend in STAGING_BACKENDS:
        env["CCLCTL_STAGE"] = opts.stage
    cmd = [sys.executable, "-m", "cclctl.benchmark.worker", opts.to_json()]
    collector = events.Collector()

    def on_line(line: str) -> None:
        seen = len(collector.foreign)
        row = collector.feed(line)
        if row is not None:
            outputs.row(collector.meta or outputs.meta, row)
        for text in collector.foreign[seen:]:  # a library's print, passed on
            print(text, file=sys.stderr)

    complete = False
    try:
        result = launch(cmd, nranks, env=env, capture_rank0_stdout=on_line)
        complete = result.returncode == 0 and collector.ended
    finally:
        outputs.close(collector.meta, complete)
    if result.interrupted:
        print(
            f"cclctl bench: {result.describe()}; {len(collector.rows)} rows kept",
            file=sys.stderr,
        )
        raise KeyboardInterrupt
    if not complete or collector.meta is None:
        raise CclError(f"bench did not finish: {result.describe()}", returncode=result.returncode)
    return collector.meta, collector.rows
