"""`cclctl bench`: an nccl-tests-style bandwidth sweep with per-element correctness checks.

Run bare, it spawns ``-n`` local ranks (``python -m cclctl.benchmark.worker``) and draws a
progress bar from rank 0's streamed rows. Inside a launched job (torchrun, srun, mpirun,
``cclctl launch -- cclctl bench``) every rank runs the sweep itself and rank 0 reports.
Either way the table goes to stdout, progress to stderr, and a failed check exits 4.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import typer

from cclctl import ui
from cclctl.benchmark import events, report
from cclctl.benchmark.options import BenchOptions, build_options
from cclctl.benchmark.results import Row, RunMeta
from cclctl.benchmark.sizes import format_bytes
from cclctl.benchmark.sweep import now_iso, total_rows
from cclctl.benchmark.worker import RankSweep
from cclctl.commands.checks import check_command
from cclctl.config import in_launched_job
from cclctl.errors import CclError

HELP = (
    "Measure collective bandwidth and check every result, like nccl-tests' *_perf.\n\n"
    "Sweeps sizes from -b to -e (multiplying by -f), out-of-place and in-place, and prints "
    "nccl-tests' table: size, count, type, redop, root, then time (us), algbw and busbw "
    "(GB/s) and #wrong for each placement, and the average bus bandwidth. Exit code 4 when "
    "any element is wrong or an op's average busbw is under --min-busbw.\n\n"
    "Run bare, it spawns -n local ranks; inside a launched job (torchrun, srun, mpirun, "
    "cclctl launch) every rank runs the sweep and rank 0 reports.\n\n"
    "Self-test of the checker: CCLCTL_BENCH_CORRUPT=RANK[:OP[:SIZE]] makes that rank corrupt "
    "one element of each result it checks, which must show up as #wrong and exit code 4."
)


def register(app: typer.Typer) -> None:
    app.command("bench", help=HELP)(bench)


def bench(
    op: str = typer.Option(
        "all_reduce",
        "--op",
        help="Collective(s), comma separated: all_reduce, all_gather, reduce_scatter, "
        "broadcast, reduce, alltoall, sendrecv.",
    ),
    nranks: int = typer.Option(
        2, "-n", "--nranks", help="Local ranks to spawn (ignored inside a launched job)."
    ),
    minbytes: str = typer.Option("8", "-b", "--minbytes", help="Smallest size: 8, 1K, 64M, 1G."),
    maxbytes: str = typer.Option("64M", "-e", "--maxbytes", help="Largest size."),
    stepfactor: int = typer.Option(2, "-f", "--stepfactor", help="Size multiplier per step."),
    warmup_iters: int | None = typer.Option(
        None, "-w", "--warmup-iters", help="Untimed iterations per size (default: up to 5)."
    ),
    iters: int | None = typer.Option(
        None, "--iters", help="Timed iterations per size (default: 20, fewer for big sizes)."
    ),
    dtype: str = typer.Option(
        "float32",
        "-d",
        "--dtype",
        help="float32 (float), float16 (half), bfloat16, float64 "
        "(double), int8, uint8, int32, int64.",
    ),
    redop: str | None = typer.Option(
        None, "--redop", help="Reduction for reducing ops: sum, prod, min, max, avg (default: sum)."
    ),
    root: int = typer.Option(0, "-r", "--root", help="Root rank of broadcast and reduce."),
    check: int = typer.Option(1, "-c", "--check", help="1: check every element; 0: skip."),
    json_path: str | None = typer.Option(
        None, "--json", help="Write the JSON report to PATH ('-': to stdout, no table)."
    ),
    csv_path: str | None = typer.Option(None, "--csv", help="Write the rows as CSV to PATH."),
    min_busbw: float | None = typer.Option(
        None, "--min-busbw", help="Fail (exit 4) when an op's average busbw (GB/s) is below."
    ),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", help="Serve Prometheus metrics from this base port per rank."
    ),
    backend: str = typer.Option(
        "cclctl",
        "--backend",
        help="cclctl (this runtime), or torch.distributed: torch (nccl with CUDA, else gloo), "
        "gloo, nccl.",
    ),
    shared_buffers: bool = typer.Option(
        False,
        "--shared-buffers",
        help="Allocate the buffers with comm.empty(): ranks on one host then read each "
        "other's buffers directly (zero-copy), as nccl-tests' -R registers them.",
    ),
) -> None:
    opts = build_options(
        op=op,
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
    )
    check_command("bench", {"--metrics-port": metrics_port})  # before any rank starts
    if in_launched_job():
        meta, rows, rank0 = _run_here(opts, metrics_port)
    else:
        meta, rows = _spawn(opts, nranks, metrics_port)
        rank0 = True
    if rank0:
        _publish(meta, rows, json_path, csv_path)
    report.raise_on_failure(meta, rows)


def _publish(
    meta: RunMeta, rows: Sequence[Row], json_path: str | None, csv_path: str | None
) -> None:
    """Table (or the JSON document with ``--json -``) to stdout, files where asked."""
    if json_path == "-":
        sys.stdout.write(json.dumps(report.to_document(meta, rows), indent=2) + "\n")
        json_path = None
    else:
        sys.stdout.write(report.render_table(meta, rows))
    sys.stdout.flush()
    report.write_reports(meta, rows, json_path, csv_path)


def _row_text(row: Row) -> str:
    return f"{row.op} {format_bytes(row.size)}"


def _run_here(opts: BenchOptions, metrics_port: int | None) -> tuple[RunMeta, list[Row], bool]:
    """Inside a launched job: this process is one rank; rank 0 shows progress and reports."""
    flags = {} if metrics_port is None else {"metrics_port": metrics_port}
    rows: list[Row] = []
    with RankSweep(opts, **flags) as job:
        rank0 = job.comm.rank == 0
        with ui.progress_bar(job.total, "bench", enabled=rank0) as bar:
            for row in job.rows():
                rows.append(row)
                bar.advance(description=_row_text(row))
        return job.meta.finished(now_iso()), rows, rank0


def _spawn(opts: BenchOptions, nranks: int, metrics_port: int | None) -> tuple[RunMeta, list[Row]]:
    """Bare: start ``nranks`` local ranks and follow rank 0's stream with a progress bar."""
    from cclctl.runtime.launcher import launch

    opts.check_world(nranks)
    env = {} if metrics_port is None else {"CCLCTL_METRICS_PORT": str(metrics_port)}
    cmd = [sys.executable, "-m", "cclctl.benchmark.worker", opts.to_json()]
    collector = events.Collector()
    with ui.progress_bar(total_rows(opts, nranks), f"starting {nranks} ranks") as bar:

        def on_line(line: str) -> None:
            row = collector.feed(line)
            if row is not None:
                bar.advance(description=_row_text(row))

        result = launch(cmd, nranks, env=env, capture_rank0_stdout=on_line)
    for line in collector.foreign:
        print(line, file=sys.stderr)
    if result.interrupted:
        raise KeyboardInterrupt
    if result.returncode != 0 or collector.meta is None or not collector.ended:
        raise CclError(f"bench did not finish: {result.describe()}", returncode=result.returncode)
    return collector.meta, collector.rows
