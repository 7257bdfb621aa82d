"""`cclctl diagnose hang`: find the rank (or link) that hangs a job, from dumps or live.

This module gathers (dump files, the job's store, local process states), hands plain records
to the pure engine in :mod:`cclctl.diagnose`, and draws the answer: a rich report, or the
``cclctl.diagnosis`` JSON document. Exit 0 healthy, 3 a fault found, 2 unusable input,
1 store unreachable.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from cclctl import ui
from cclctl.commands import diagnose_slow
from cclctl.commands.checks import check_command
from cclctl.commands.diagnose_console import report_console
from cclctl.commands.diagnose_sources import (
    default_folder,
    live_statuses,
    no_cycle_collection,
    read_dumps,
    reading,
)
from cclctl.diagnose import report
from cclctl.diagnose.engine import diagnose
from cclctl.diagnose.model import Diagnosis, Options
from cclctl.diagnose_io import procs
from cclctl.diagnose_io.live import diagnose_live
from cclctl.errors import ConfigError, FaultFound, UsageError
from cclctl.limits import MAX_WORLD_SIZE
from cclctl.live.alike import ALIKE_FROM

HELP = "Diagnose a job: the rank or link that hangs it (hang), or that slows it (slow)."

HANG_HELP = (
    "Find the rank or link that hangs a job, from flight-recorder dumps or a live job.\n\n"
    "Checks, in order: ranks that are missing, dead, SIGSTOPped or with a stale status; "
    "per communicator, "
    "ranks that never entered the collective the others wait in (and what they do instead); "
    "ranks whose op, dtype, count or root disagree at the same seq; and where the chains of "
    "'waiting on' end (a rank, or a link when two ranks wait on each other). Each finding "
    "names the suspects with host and pid, the evidence, and what to do next.\n\n"
    "A failure is one event: where the ranks adopted the job's revoke record, its origin is "
    "the verdict (a dead rank, a link, a mismatched rank, an operator's abort) and the other "
    "ranks' failures are its evidence; without one, the breaks a dead or failed rank caused "
    "are traced back to it. Ranks that finished cleanly are done, never missing.\n\n"
    "Examples:\n\n"
    "  cclctl diagnose hang    (the newest job's dumps in ${TMPDIR:-/tmp}/cclctl-<uid>/)\n\n"
    "  cclctl diagnose hang --job train7    (that job's dumps there)\n\n"
    "  cclctl diagnose hang /tmp/traces    (the cclctl-<job>-rank<r>.json in it)\n\n"
    "  cclctl diagnose hang r0.json r3.json    (just these dumps)\n\n"
    "  cclctl diagnose hang --store node0:29500    (a live job, from its store)\n\n"
    "  cclctl diagnose hang --store node0:29500 --job train7 --json\n\n"
    "  CCLCTL_STORE=node0:29500 cclctl diagnose hang    (the store from the environment)\n\n"
    "Ranks dump on a watchdog expiry (every rank of the job then), on SIGTERM, on `kill -USR1 "
    "<pid>` and at an exit after errors, into CCLCTL_TRACE_DIR when set, else their job's "
    "folder ${TMPDIR:-/tmp}/cclctl-<uid>/<job>/; with no DUMP and no store (--store or "
    "CCLCTL_STORE) this reads that folder: CCLCTL_TRACE_DIR, the --job's, or the job whose "
    "dumps are newest (stderr says which). A rank that closes its communicator after a "
    "clean run leaves a small finished document there instead. Each dump holds the Python "
    "stack of every thread of its rank, and a verdict shows where its suspect is in one "
    "line ('stack: rank 2 is in train.py:41 load_batch -> time.sleep'; --stacks or --json "
    "for the whole stacks). "
    "PyTorch Flight Recorder dumps (nccl_trace_rank_<r>, pickle or JSON) are read too, "
    "with where each collective was called. A folder holding both kinds is one job, the one "
    "cclctl's dumps name: per rank cclctl's dump gives the records and the Flight "
    "Recorder's call site joins its stacks; a rank with only a Flight Recorder dump is read "
    "from that. Processes on this host are looked at too (stopped, zombie, gone); py-spy "
    "is suggested only for a live job's running process. Exit codes: 0 no fault, 3 fault "
    "found (also when a reader such as `| head` closes the output early), 2 unusable input "
    "(the message names the file), 1 store unreachable."
)


def register(app: typer.Typer) -> None:
    sub = typer.Typer(help=HELP, no_args_is_help=True)
    sub.command("hang", help=HANG_HELP, no_args_is_help=False)(hang)
    diagnose_slow.register(sub)
    app.add_typer(sub, name="diagnose")


def hang(
    dumps: Annotated[
        list[str] | None,
        typer.Argument(metavar="DUMP", help="Dump files, or folders of them.", show_default=False),
    ] = None,
    store: str | None = typer.Option(
        None,
        "--store",
        help="A live job's store, HOST:PORT, instead of dumps \\[default without dumps: "
        "CCLCTL_STORE].",
        show_default=False,
    ),
    job: str | None = typer.Option(
        None,
        "--job",
        help="Job to diagnose \\[default: the only one in the store or dumps; with neither, "
        "the job whose dumps are newest in ${TMPDIR:-/tmp}/cclctl-<uid>/].",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the cclctl.diagnosis document."),
    world_size: int | None = typer.Option(
        None, "--world-size", help="Ranks in the job, when the documents cannot say."
    ),
    stale: float = typer.Option(
        Options.stale_after_s, "--stale", help="Live: a heartbeat older than this (s) is stale."
    ),
    skew: float = typer.Option(
        Options.skew_margin_s,
        "--skew",
        help="Live: seconds of clock skew allowed for ranks on other hosts.",
    ),
    stacks: bool = typer.Option(
        False,
        "--stacks",
        help="Also print the whole Python stack of every thread of each suspect (from its dump).",
    ),
    stuck_after: float = typer.Option(
        Options.stuck_after_s,
        "--stuck-after",
        help="A collective in flight longer than this (s) counts as hung.",
    ),
) -> None:
    opts = _options(stale, skew, stuck_after, world_size)
    if store is not None and dumps:
        raise UsageError("give dump files or --store, not both")
    address = None if dumps else check_command("diagnose hang", {"--store": store}).store
    if dumps or address is None:  # given dumps use no CCLCTL_* variable
        diag = _from_dumps(dumps or [default_folder(job)], job, world_size, opts)
    else:  # the same verdict as top's
        with no_cycle_collection(), reading(address) as say:
            statuses = live_statuses(address, job, ALIKE_FROM, say)
            say(f"diagnosing {len(statuses.statuses):,} ranks")
            diag = diagnose_live(statuses, world_size, opts)
    if as_json:
        ui.write_result(json.dumps(diag.to_dict(), indent=2) + "\n")
    else:
        _print(diag, stacks)
    if diag.fault:
        raise FaultFound(report.fault_message(diag), kinds=[v.kind for v in diag.faults])


def _from_dumps(
    paths: list[str], job: str | None, world_size: int | None, opts: Options
) -> Diagnosis:
    """The verdict over the dumps among ``paths``, with this host's view of their processes."""
    inputs = read_dumps(paths, job)
    return diagnose(
        inputs.snapshots,
        world_size=world_size if world_size is not None else inputs.world_size,
        now_ns=inputs.now_ns,
        proc=procs.for_post_mortem(procs.process_states(inputs.snapshots)),
        unreadable=inputs.unreadable,
        notes=inputs.notes,
        remarks=inputs.remarks,
        options=opts,
    )


def _options(stale: float, skew: float, stuck_after: float, world_size: int | None) -> Options:
    for flag, value in (("--stale", stale), ("--stuck-after", stuck_after)):
        if not value > 0:
            raise ConfigError(f"{flag} must be positive, not {value!r}", flag=flag)
    if not skew >= 0:
        raise ConfigError(f"--skew must be zero or more, not {skew!r}", flag="--skew")
    if world_size is not None and world_size < 1:
        raise ConfigError(f"--world-size must be at least 1, not {world_size}", flag="--world-size")
    if world_size is not None and world_size > MAX_WORLD_SIZE:
        raise ConfigError(
            f"--world-size {world_size} is over the limit of {MAX_WORLD_SIZE:,} ranks",
            flag="--world-size",
        )
    return Options(stale_after_s=stale, skew_margin_s=skew, stuck_after_s=stuck_after)


def _print(diag: Diagnosis, stacks: bool) -> None:
    console = report_console()
    console.print(Text(report.headline(diag), style="bold"))
    for i, block in enumerate(report.blocks(diag), 1):
        style = "bold red" if block.fault else "bold green"
        line = Text(f"\n{i}. ")
        line.append(block.label, style=style)
        line.append(f"  {block.summary}")
        console.print(line)
        if block.suspects:
            console.print(Text("   suspects: ").append(block.suspects, style="bold"))
        for where in block.where:
            console.print(Text("   stack: ", style="magenta").append(where))
        for item in block.evidence:
            console.print(Text(f"   - {item}"))
        if block.next_step:
            console.print(Text("   next: ", style="cyan").append(block.next_step))
        for frame in block.stacks if stacks else ():
            console.print(Text(f"   {frame}", style="dim" if frame.startswith("    ") else ""))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, title_justify="left")
    for name in report.COMM_COLUMNS:
        table.add_column(name, no_wrap=True, justify="right" if name == "size" else "left")
    for row in report.comm_rows(diag):
        table.add_row(*row, style="red" if row[3].startswith("hung") else "")
    console.print()
    console.print(table)
    for note in diag.notes:
        console.print(Text(f"note: {note}", style="dim"))
