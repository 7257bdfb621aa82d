"""`cclctl diagnose slow`: which rank, link or host makes a running job slow.

Gathers what ``diagnose hang`` gathers (a live job's statuses from its store, or a folder
of dumps), hands every rank's ``signals`` to the pure analysis (:mod:`cclctl.diagnose.slow`)
and draws the verdict, or prints the ``cclctl.slow`` JSON document. Exit 3 on a finding,
0 when the job is healthy or too young or idle to judge (the reason is printed), 2 on bad
input, 1 when the store cannot be reached.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.text import Text

from cclctl import ui
from cclctl.commands.checks import check_command
from cclctl.commands.diagnose_console import report_console
from cclctl.commands.diagnose_sources import (
    default_folder,
    live_statuses,
    no_cycle_collection,
    read_dumps,
    reading,
)
from cclctl.commands.drawn_table import Column, DrawnTable
from cclctl.diagnose import slow_report
from cclctl.diagnose.slow_model import SLOW, SlowOptions, SlowReport
from cclctl.diagnose.slow_probe import ProbeEvidence
from cclctl.diagnose_io.slow_inputs import slow_from_inputs, slow_live, with_probe
from cclctl.errors import ConfigError, FaultFound, UsageError

SLOW_HELP = (
    "Find the rank, link or host that makes a running job slow, live or from its dumps.\n\n"
    "Every rank keeps rolling windows (CCLCTL_SLOW_WINDOW, 5 s) of when it enters each "
    "collective, how long it spends inside them, and per peer the bytes it moved and the "
    "time it blocked on that peer (over TCP, also how long the peer's messages took to "
    "arrive). Findings:\n\n"
    "  slow_rank: a compute straggler: it enters its collectives last and waits least "
    "(the others wait for it inside theirs, so their calls look slow, not its).\n\n"
    "  slow_link: a directed link whose throughput (over TCP, bytes over the time its "
    "messages took from first byte to last; over shared memory, over the time both ends "
    "blocked moving them) is far below the job's other links of the same kind (shared "
    "memory, TCP within a host, TCP across hosts).\n\n"
    "  slow_host: all the ranks of one host late, or every link out of (or into) it slow.\n\n"
    "A finding needs an estimated job slowdown of at least --min-slowdown (1.15: 15%) in "
    "--confirm consecutive windows (2), judged with medians and MADs, so jitter, a busy "
    "machine, a GC pause or one long step are not findings. Entry times on different hosts "
    "are compared only beyond --skew (2 ms of clock skew); the findings rest on clock-free "
    "figures (time inside calls, link throughput) first.\n\n"
    "Examples:\n\n"
    "  cclctl diagnose slow --store node0:29500    (a live job: what is slow now)\n\n"
    "  CCLCTL_STORE=node0:29500 cclctl diagnose slow --json\n\n"
    "  cclctl diagnose slow    (the newest job's dumps in ${TMPDIR:-/tmp}/cclctl-<uid>/)\n\n"
    "  cclctl diagnose slow --job train7    (that job's dumps)\n\n"
    "  cclctl diagnose slow /tmp/traces    (the dumps in a folder)\n\n"
    "From dumps, a suspect slow in any run of windows the dumps hold is named; live, only "
    "one slow in the newest windows. Exit codes: 3 a finding, 0 healthy or not judged yet "
    "(too young, too idle: the reason is printed), 2 unusable input, 1 store unreachable."
)


def register(sub: typer.Typer) -> None:
    sub.command("slow", help=SLOW_HELP, no_args_is_help=False)(slow)


def slow(
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
        help="Job to judge \\[default: the only one in the store or dumps; with neither, the "
        "job whose dumps are newest in ${TMPDIR:-/tmp}/cclctl-<uid>/].",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the cclctl.slow document."),
    min_slowdown: float = typer.Option(
        SlowOptions.min_slowdown,
        "--min-slowdown",
        help="The least estimated job slowdown that is a finding (1.15: 15% slower).",
    ),
    confirm: int = typer.Option(
        SlowOptions.confirm, "--confirm", help="Consecutive windows a suspect must be found in."
    ),
    sustained: float = typer.Option(
        SlowOptions.sustained_slowdown,
        "--sustained-slowdown",
        help=f"The least slowdown a straggler found in {SlowOptions.confirm_sustained} "
        "consecutive windows is a finding at (at or above --min-slowdown: off).",
    ),
    skew: float = typer.Option(
        SlowOptions.skew_s,
        "--skew",
        help="Seconds of clock skew tolerated between hosts when entry times are compared.",
    ),
) -> None:
    if store is not None and dumps:
        raise UsageError("give dump files or --store, not both")
    address = None if dumps else check_command("diagnose slow", {"--store": store}).store
    live = not dumps and address is not None
    opts = _options(min_slowdown, confirm, skew, ongoing=live, sustained=sustained)
    probe: ProbeEvidence | None = None
    if live and address is not None:
        report, probe = _live(address, job, opts)
    else:
        paths = dumps or [default_folder(job)]
        report = slow_from_inputs(read_dumps(paths, job), opts, paths)
    if as_json:
        doc = report.to_dict()
        if probe is not None:
            doc["probe"] = probe.to_dict()
        ui.write_result(json.dumps(doc, indent=2) + "\n")
    else:
        _print(report, probe)
    if report.status == SLOW:
        raise FaultFound(slow_report.fault_message(report), kinds=[f.kind for f in report.findings])


def _live(
    address: str, job: str | None, opts: SlowOptions
) -> tuple[SlowReport, ProbeEvidence | None]:
    """A live job's verdict, with its last probe as evidence."""
    with no_cycle_collection(), reading(address) as say:
        statuses = live_statuses(address, job, say=say)
        say(f"judging the windows of {len(statuses.statuses):,} ranks")
        return with_probe(slow_live(statuses, opts), statuses)


def _options(
    min_slowdown: float, confirm: int, skew: float, ongoing: bool, sustained: float
) -> SlowOptions:
    for flag, value in (("--min-slowdown", min_slowdown), ("--sustained-slowdown", sustained)):
        if not 1.0 < value <= 20.0:
            raise ConfigError(f"{flag} must be above 1 and at most 20, not {value!r}", flag=flag)
    if not 1 <= confirm <= 12:
        raise ConfigError(f"--confirm must be 1 to 12 windows, not {confirm}", flag="--confirm")
    if not 0 <= skew <= 60:
        raise ConfigError(f"--skew must be 0 to 60 seconds, not {skew!r}", flag="--skew")
    return SlowOptions(min_slowdown=min_slowdown, confirm=confirm, skew_s=skew, ongoing=ongoing,
                       sustained_slowdown=sustained)  # fmt: skip


def _print(report: SlowReport, probe: ProbeEvidence | None = None) -> None:
    console = report_console()
    style = "bold red" if report.status == SLOW else "bold"
    console.print(Text(slow_report.headline(report), style=style))
    for i, finding in enumerate(report.findings, 1):
        line = Text(f"\n{i}. ")
        line.append(finding.kind.replace("_", " ").upper(), style="bold red")
        line.append(f"  {finding.summary}")
        console.print(line)
        for item in finding.evidence:
            console.print(Text(f"   - {item}"))
        console.print(Text("   next: ", style="cyan").append(finding.next_step))
    rows = slow_report.rank_rows(report)
    if rows:  # a row per rank: drawn line by line (100,000 rows in about a second)
        columns = [Column(name, right=True) for name in slow_report.RANK_COLUMNS]
        suspects = {r for f in report.findings for r in f.ranks}
        styled = [(row, "red" if int(row[0]) in suspects else "") for row in rows]
        console.print()
        console.print(DrawnTable(columns, styled))
    if probe is not None:
        console.print(Text(f"\n{probe.headline()}", style="bold" if probe.unnamed else "dim"))
        for found in probe.unnamed:
            console.print(Text(f"   - probe {found.kind}: {found.text}"))
    for note in report.notes:
        console.print(Text(f"note: {note}", style="dim"))
