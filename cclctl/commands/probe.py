"""`cclctl probe`: every directed link of the job measured in N-1 rounds, the slow ones named.

Run bare, it spawns ``-g`` local ranks (``python -m cclctl.probe.worker``) and reads rank 0's
one JSON line; inside a launched job every rank takes part and rank 0 reports. Either way
the verdict (``cclctl/probe/verdict.py``) is judged here, printed as a matrix and one line
per finding, and written to ``-J``; exit 3 when something is flagged.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from cclctl import ui
from cclctl.benchmark.sizes import parse_size
from cclctl.commands.checks import check_command
from cclctl.config import in_launched_job, inherited_environment
from cclctl.errors import BadInput, CclError, ConfigError, FaultFound, UsageError
from cclctl.probe import document, render
from cclctl.probe.model import ProbeRun
from cclctl.probe.options import ProbeOptions
from cclctl.probe.verdict import DEFAULT_K, DEFAULT_TOLERANCE, Bounds, judge

if TYPE_CHECKING:
    from cclctl.probe.in_job import ProbeResult  # the runtime: not for every CLI start

DEFAULT_JOB = "probe"

HELP = (
    "Measure every directed link between the job's ranks and name the slow ones.\n\n"
    "A round-robin schedule (the circle method: N-1 rounds, a bye each round for odd N) "
    "keeps every rank busy with one partner per round. Each pair measures latency "
    "(ping-pong of -b bytes) and bandwidth (-e bytes) over the job's own transport, "
    "each direction alone (--direction each) or both at once (both), each figure the "
    "median of its repeats (-n round trips; the bandwidth transfers that fit --budget). "
    "A directed link is flagged when it is below the median minus --k MADs (of log "
    "bandwidths) of the links of its kind (shared memory, TCP within a host, TCP across hosts; "
    "and never above a third of that median) and below --min-bw and the --baseline, where "
    "given. A host whose links to other hosts are all flagged (egress or ingress) is "
    "named as the host. A partner that does not answer within -T is 'unreachable', and "
    "the rest of the schedule runs.\n\n"
    "Prints a ranks x ranks bandwidth matrix up to 8 ranks (a list of flagged links "
    "beyond) and one line per finding; -J writes the cclctl.probe document. Exit 0 when "
    "all links pass, 3 when something is flagged or unreachable, 2 on bad usage.\n\n"
    "Run bare, it spawns -g local ranks; inside a launched job (cclctl launch, torchrun, "
    "srun, mpirun) every rank takes part and rank 0 reports, and publishes the result to "
    "the job's store (cclctl top shows a line about the last probe; cclctl diagnose slow "
    "--store adds it to its evidence) and, with CCLCTL_METRICS_PORT, as cclctl_probe_* "
    "metrics on its port while it runs. A training script probes its own job with "
    "cclctl.probe.in_job.probe(comm) on every rank.\n\n"
    "Pre-flight a new node against a known-good one: on two known-good nodes run "
    "'srun -N2 --ntasks-per-node=1 cclctl probe -J good.json'; then on a known-good node "
    "and the new one 'srun -N2 --ntasks-per-node=1 cclctl probe --baseline good.json' "
    "(exit 3 names the link or the host below the baseline's median, less --tolerance). "
    "With ranks on three or more hosts, --per-host probes one rank per host and tells a "
    "slow host from a slow link."
)


def register(app: typer.Typer) -> None:
    app.command("probe", help=HELP)(probe)


_NRANKS = typer.Option(4, "-g", "--nranks", help="Local ranks to spawn (bare runs only).")
_SMALL = typer.Option("8", "-b", "--minbytes", help="Latency message size (8, 1K).")
_LARGE = typer.Option("4M", "-e", "--maxbytes", help="Bandwidth message size (4M, 64M).")
_ITERS = typer.Option(10, "-n", "--iters", help="Timed round trips per latency (median).")
_WARMUP = typer.Option(1, "-w", "--warmup", help="Untimed transfers first.")
_BUDGET = typer.Option(
    0.25,
    "--budget",
    help="Seconds of timed bandwidth transfers per direction (1 to 64 "
    "transfers; the figure is their median).",
)
_DIRECTION = typer.Option(
    "each", "--direction", help="each: one direction at a time (names the direction); "
    "both: both at once, the pair's figure for each.",
)  # fmt: skip
_PAIRS = typer.Option(
    "all", "--pairs", help="all: every pair (N-1 rounds); ring: neighbours (2-3 rounds); "
    "sample: --rounds rounds of random partners.",
)  # fmt: skip
_ROUNDS = typer.Option(None, "--rounds", help="Rounds of --pairs sample (default 3).")
_SEED = typer.Option(0, "--seed", help="Seed of --pairs sample.")
_PER_HOST = typer.Option(False, "--per-host", help="One rank per host: the fabric between hosts.")
_TIMEOUT = typer.Option(5.0, "-T", "--timeout", help="Seconds one transfer may take.")
_K = typer.Option(DEFAULT_K, "--k", help="MADs below the median that flag a link.")
_MIN_BW = typer.Option(None, "--min-bw", help="Flag links also below this floor, GB/s.")
_BASELINE = typer.Option(
    None, "--baseline", help="A previous -J document: flag links also below its median "
    "of their kind, less --tolerance.",
)  # fmt: skip
_TOLERANCE = typer.Option(
    DEFAULT_TOLERANCE, "--tolerance", help="Share below the baseline that still passes."
)
_JSON = typer.Option(None, "-J", "--json", help="Write the cclctl.probe document ('-': stdout).")


def probe(
    nranks: int = _NRANKS,
    minbytes: str = _SMALL,
    maxbytes: str = _LARGE,
    iters: int = _ITERS,
    warmup: int = _WARMUP,
    budget: float = _BUDGET,
    direction: str = _DIRECTION,
    pairs: str = _PAIRS,
    rounds: int | None = _ROUNDS,
    seed: int = _SEED,
    per_host: bool = _PER_HOST,
    timeout: float = _TIMEOUT,
    k: float = _K,
    min_bw: float | None = _MIN_BW,
    baseline: str | None = _BASELINE,
    tolerance: float = _TOLERANCE,
    json_path: str | None = _JSON,
) -> None:
    """Probe the links (see HELP): spawned local ranks, or this rank of a launched job."""
    opts = ProbeOptions(
        small=parse_size(minbytes, "-b"), large=parse_size(maxbytes, "-e"), iters=iters,
        warmup=warmup, budget_s=budget, direction=direction, pairs=pairs, rounds=rounds,
        seed=seed, per_host=per_host, timeout_s=timeout,
    )  # fmt: skip
    bounds = _bounds(k, min_bw, baseline, tolerance)
    check_command("probe", {"-g": nranks, "--timeout": timeout})
    if in_launched_job():
        result = _run_here(opts, bounds)
        if result is None:
            return  # not rank 0: it reports
        run, verdict = result.run, result.verdict
    else:
        run = _spawn(opts, nranks)
        verdict = judge(run, bounds)
    to_stdout = json_path == "-"
    text = render.report(run, verdict) + "\n"
    if to_stdout:
        print(text, end="", file=sys.stderr)  # stdout carries the document
    else:
        ui.write_result(text)
    if json_path:
        doc = document.dumps(run, verdict)
        if to_stdout:
            ui.write_result(doc)
        else:
            _write(json_path, doc)
    if not verdict.ok:
        raise FaultFound(f"probe: {len(verdict.findings)} finding(s)")


def _bounds(k: float, min_bw: float | None, baseline: str | None, tolerance: float) -> Bounds:
    if not k > 0:
        raise ConfigError(f"--k {k} must be above 0", flag="--k")
    if min_bw is not None and not min_bw > 0:
        raise ConfigError(f"--min-bw {min_bw} must be above 0 (GB/s)", flag="--min-bw")
    if not 0 <= tolerance < 1:
        raise ConfigError(f"--tolerance {tolerance} must be from 0 to below 1",
                          flag="--tolerance")  # fmt: skip
    medians = {}
    if baseline is not None:
        try:
            text = Path(baseline).read_text()
        except OSError as exc:
            raise BadInput(f"--baseline {baseline}: {exc.strerror or exc}",
                           where=baseline) from None  # fmt: skip
        medians = document.baseline(text, baseline)
    floor = None if min_bw is None else min_bw * 1e9
    return Bounds(k=k, min_bw=floor, baseline=medians, tolerance=tolerance)


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise UsageError(f"-J {path}: {exc.strerror or exc}", flag="--json") from None


def _run_here(opts: ProbeOptions, bounds: Bounds) -> ProbeResult | None:
    """Inside a launched job: this process is one rank; rank 0 gets the result, which it
    published to the job's store (``cclctl top``, ``diagnose slow``) and its metrics."""
    from cclctl.probe.worker import probe_here  # the runtime: not for every CLI start

    return probe_here(opts, bounds)


def _spawn(opts: ProbeOptions, nranks: int) -> ProbeRun:
    """Bare: ``nranks`` local ranks; rank 0's line carries the run."""
    from cclctl.launch.launcher import launch
    from cclctl.probe.worker import parse_line

    if nranks < 2:
        raise UsageError(f"-g {nranks}: a probe needs at least 2 ranks", flag="-g")
    env = {"CCLCTL_JOB": inherited_environment().get("CCLCTL_JOB") or DEFAULT_JOB}
    cmd = [sys.executable, "-m", "cclctl.probe.worker", opts.to_json()]
    found: list[ProbeRun] = []

    def on_line(line: str) -> None:
        run = parse_line(line.strip())
        if run is not None:
            found.append(run)
        elif line.strip():
            print(line.rstrip(), file=sys.stderr)  # a library's print, passed on

    result = launch(cmd, nranks, env=env, capture_rank0_stdout=on_line)
    if result.interrupted:
        raise KeyboardInterrupt
    if result.returncode != 0 or not found:
        raise CclError(f"probe did not finish: {result.describe()}", returncode=result.returncode)
    return found[0]
