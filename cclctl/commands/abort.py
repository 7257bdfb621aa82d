"""`cclctl abort`: an operator revokes every communicator of a live job.

It writes the job's one revoke record (``revoke``, first writer wins) with the job's token,
waits up to ``--wait`` for every rank's ``revoke_ack/<rank>``, and prints who acknowledged
and why the others did not (:mod:`cclctl.live.acks`, from the live diagnosis' liveness
verdicts). Exit 0 when every live rank acknowledged, 3 when some did not, 2 without the
token (and then nothing is written).
"""

from __future__ import annotations

import contextlib
import json
import time

import typer
from rich.text import Text

from cclctl import ui
from cclctl.commands.operator_job import liveness_diagnosis, operator, operator_job
from cclctl.commands.store_access import store_option
from cclctl.diagnose.text import ranks_word
from cclctl.errors import BadInput, FaultFound, StoreTimeout
from cclctl.live.acks import AbortReport, Ack, Silent, acks_in, silent_ranks, to_document
from cclctl.live.classify import classify
from cclctl.live.culprit import read_culprits
from cclctl.live.rank_view import DEFAULT_STALE_S, Thresholds
from cclctl.live.snapshot import job_prefix, parse
from cclctl.revocation import KEY, OPERATOR, Revocation, ack_key, decode
from cclctl.store.scope import ScopedStore

HELP = (
    "Abort a live job: revoke every communicator of every rank, as an operator.\n\n"
    "Writes the job's revoke record to its store (the first failure of a job wins: if one is "
    "there already, abort says so and writes nothing). Every rank adopts it within "
    'milliseconds: a rank inside a collective raises CollectiveAborted naming you ("aborted '
    'by operator alice@node0: TEXT"), even when a peer is SIGSTOPped or a link is cut; a '
    "rank between collectives raises it at its next call. Each rank acknowledges; abort "
    "waits up to --wait seconds for all of them and prints who acknowledged (and the call "
    "each was in) and who did not, and why: stopped (SIGSTOP), dead, a stale heartbeat, no "
    "status, or running without an acknowledgement. A process's state is seen only on this "
    "host.\n\n"
    "It needs the job's token: CCLCTL_TOKEN, else the job's token file on this host "
    "(CCLCTL_TRACE_DIR, else ${TMPDIR:-/tmp}/cclctl-<uid>/<job>/token, which rank 0 writes). "
    "Without it the store refuses any write: abort says so, exits 2 and changes nothing.\n\n"
    "Examples:\n\n"
    "  cclctl abort --store node0:29500 --reason 'bad data shard'\n\n"
    "  CCLCTL_TOKEN=... cclctl abort --store node0:29500 --job train7 --json\n\n"
    "Exit codes: 0 every live rank acknowledged (dead and finished ranks are not live), 3 "
    "some did not, 2 no token or bad input, 1 store unreachable."
)

DEFAULT_WAIT_S = 2.0
DEFAULT_REASON = "no reason given"
#: Silent ranks shown one per line; beyond this they are folded by state.
SHOWN_SILENT = 16


#: How long abort waits for the acknowledgements before it looks again at who is silent.
ACK_LOOK_S = 0.25


def register(app: typer.Typer) -> None:
    app.command("abort", help=HELP)(abort)


def abort(
    store: str | None = store_option(),
    job: str | None = typer.Option(
        None, "--job", help="Job to abort \\[default: the only one in the store]."
    ),
    reason: str | None = typer.Option(
        None,
        "--reason",
        help=f"Why, in words, for every rank's error \\[default: {DEFAULT_REASON}].",
    ),
    wait: float = typer.Option(
        DEFAULT_WAIT_S, "--wait", help="Seconds to wait for every live rank's acknowledgement."
    ),
    stale: float = typer.Option(
        DEFAULT_STALE_S, "--stale", help="A heartbeat older than this (s) is stale (as top's)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the cclctl.abort document."),
) -> None:
    with operator_job("abort", store, job, wait, stale) as target:
        name = target.name
        report = _revoke(
            target.scoped, name, target.world_size, reason or DEFAULT_REASON, wait, stale
        )
    if as_json:
        ui.write_result(json.dumps(to_document(report), indent=2) + "\n")
    else:
        _print(report)
    if not report.complete:
        live = [s.rank for s in report.silent if s.live]
        raise FaultFound(
            f"{ranks_word(live)} of job {name!r} did not acknowledge the abort within {wait:g}s",
            ranks=live,
        )


def operator_record(reason: str) -> Revocation:
    """The record of an operator's abort of every communicator (empty ``comm``)."""
    return Revocation(
        kind="aborted",
        origin=OPERATOR,
        seen_by=OPERATOR,
        via="operator",
        by=operator(),
        reason=reason,
        comm="",
    )


def _revoke(
    scoped: ScopedStore,
    job: str,
    world_size: int,
    reason: str,
    wait_s: float,
    stale_s: float,
) -> AbortReport:
    """Write the record (unless one is there), wait for the acks, read who is silent."""
    mine = operator_record(reason).encode()
    held = scoped.compare_set(KEY, None, mine)
    written = held == mine
    record, unreadable = None, ""
    try:
        record = decode(held, f"the revoke record of job {job!r}")
    except BadInput as exc:
        unreadable = str(exc)
    deadline = time.monotonic() + wait_s
    keys = [ack_key(r) for r in range(world_size)]
    while True:
        left = deadline - time.monotonic()
        if left > 0:
            with contextlib.suppress(StoreTimeout):  # the listing below says who is silent
                scoped.wait(keys, timeout_s=min(left, ACK_LOOK_S))
        listing = scoped.client.list(job_prefix(job))
        after = parse(job, scoped.address, listing)
        view = classify(after, world_size=world_size, thresholds=Thresholds(stale_s=stale_s))
        acked = {r: a for r, a in acks_in(listing, job).items() if r < view.world_size}
        culprits = read_culprits(liveness_diagnosis(after, stale_s), view)
        silent = silent_ranks(after, view, culprits, acked)
        # done once every rank that can still acknowledge has: a dead or finished one never will
        if all(not s.live for s in silent) or time.monotonic() >= deadline:
            break
    return AbortReport(
        job, scoped.address, view.world_size, record, written, wait_s, acked, silent, unreadable
    )


def _print(report: AbortReport) -> None:
    console = ui.ResultConsole(highlight=False, soft_wrap=True)
    record = report.record
    what = record.describe() if record is not None else report.unreadable_record
    if report.written:
        console.print(Text(f"aborted job {report.job} ({report.world_size} ranks): {what}"))
    else:
        console.print(
            Text(f"job {report.job} already failed: {what}; abort wrote nothing", style="bold")
        )
    console.print(
        Text(f"acknowledged: {len(report.acked)} of {report.world_size} ranks", style="green")
    )
    for in_call, ranks in _by_call(report.acked).items():
        console.print(Text(f"  {ranks_word(ranks)}: {in_call}"))
    if report.silent:
        style = "bold red" if not report.complete else "yellow"
        console.print(
            Text(f"not acknowledged within {report.wait_s:g}s: {len(report.silent)}", style=style)
        )
    for line in _silent_lines(report.silent):
        console.print(Text(f"  {line}"))


def _by_call(acked: dict[int, Ack]) -> dict[str, list[int]]:
    """Acknowledged ranks grouped by the call they were in (``in all_reduce seq 5``)."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(acked):
        groups.setdefault(acked[rank].words(), []).append(rank)
    return groups


def _silent_lines(silent: list[Silent]) -> list[str]:
    """One line per silent rank with its pid and host, or one per state when there are many."""
    if len(silent) <= SHOWN_SILENT:
        lines = []
        for s in silent:
            where = " ".join(w for w in (s.pid and f"pid {s.pid}", s.host and f"on {s.host}") if w)
            lines.append(f"rank {s.rank}{f' ({where})' if where else ''}: {s.reason}")
        return lines
    states: dict[str, list[int]] = {}
    for s in silent:
        states.setdefault(s.state, []).append(s.rank)
    return [f"{ranks_word(ranks)}: {state}" for state, ranks in states.items()]
