"""`cclctl retry`: an operator revokes a stuck job's in-flight call and has every rank
run it again under a new epoch, with no process restarted.

It writes an operator's ``retry`` record to the job's ``revoke`` key (first writer wins, as
for ``cclctl abort``); every rank adopts it, its blocked call ends, and the retry loop
(:mod:`cclctl.runtime.comm.recovery.retrying`) agrees and renews the transport as for a link fault.
The command then reads the ranks' ``retry/<comm>/<epoch>/{in,up}/<rank>`` entries
(:mod:`cclctl.live.rejoins`) until every live rank re-runs or ``--wait`` ends.
"""

from __future__ import annotations

import json
import time

import typer
from rich.text import Text

from cclctl import ui
from cclctl.commands.operator_job import liveness_diagnosis, operator, operator_job
from cclctl.commands.store_access import store_option
from cclctl.diagnose.text import ranks_word
from cclctl.errors import BadInput, FaultFound
from cclctl.live.acks import Ack, acks_in, silent_ranks
from cclctl.live.classify import classify
from cclctl.live.culprit import read_culprits
from cclctl.live.rank_view import DEFAULT_STALE_S, Thresholds
from cclctl.live.rejoins import RetryReport, latest_epochs, rejoins_in, to_document
from cclctl.live.snapshot import JobStatuses, job_prefix, parse
from cclctl.revocation import KEY, OPERATOR, Revocation, ack_key, decode
from cclctl.store.scope import ScopedStore

HELP = (
    "Retry a stuck job's interrupted call on every rank, with no process restarted.\n\n"
    "For a job stuck on a blackholed link, or behind a rank that was frozen and resumed: "
    "writes an operator's retry record to the job's store (as abort does; the first record "
    "wins). Every rank adopts it within a store round trip, its blocked collective ends, "
    "the ranks agree in the store, renew their links under the communicator's next epoch "
    "and run the call again at the same seq from its input (exact results, "
    "docs/fault-tolerance.md). retry waits up to --wait seconds and prints what is retried "
    "(comm, seq, op) and which ranks rejoined; a rank that did not is named with why "
    "(stopped, dead, a stale heartbeat, ...). A rank whose communicator cannot retry "
    "(CCLCTL_RETRY_BUDGET=0, or shared memory only) is aborted instead, its error naming "
    "you. A retry already under way (a link fault the ranks are riding through) is waited "
    "for, not doubled; any other failure of the job is not retried (exit 3).\n\n"
    "It needs the job's token: CCLCTL_TOKEN, else the job's token file on this host "
    "(CCLCTL_TRACE_DIR, else ${TMPDIR:-/tmp}/cclctl-<uid>/<job>/token). Without it retry "
    "exits 2 and changes nothing.\n\n"
    "Examples:\n\n"
    "  cclctl retry --store node0:29500\n\n"
    "  CCLCTL_TOKEN=... cclctl retry --store node0:29500 --job train7 --wait 10 --json\n\n"
    "Exit codes: 0 every live rank re-runs, 3 some did not within --wait (or the job failed "
    "otherwise), 2 no token or bad input, 1 store unreachable."
)

DEFAULT_WAIT_S = 5.0
POLL_S = 0.02  # between two listings of the job while the ranks rejoin
RETRIED = ("link", "retry")  # the records a retry is under way for


def register(app: typer.Typer) -> None:
    app.command("retry", help=HELP)(retry)


def retry(
    store: str | None = store_option(),
    job: str | None = typer.Option(
        None, "--job", help="Job to retry \\[default: the only one in the store]."
    ),
    reason: str = typer.Option("", "--reason", help="Why, in words, for the ranks' records."),
    wait: float = typer.Option(
        DEFAULT_WAIT_S, "--wait", help="Seconds to wait for every rank to re-run the call."
    ),
    stale: float = typer.Option(
        DEFAULT_STALE_S, "--stale", help="A heartbeat older than this (s) is stale (as top's)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the cclctl.retry document."),
) -> None:
    with operator_job("retry", store, job, wait, stale) as target:
        name = target.name
        report = _retry(target.scoped, name, target.world_size, reason, wait, stale)
    if as_json:
        ui.write_result(json.dumps(to_document(report), indent=2) + "\n")
    else:
        _print(report)
    if report.missing:
        raise FaultFound(
            f"{ranks_word(report.missing)} of job {name!r} did not rejoin the retry within "
            f"{wait:g}s",
            ranks=report.missing,
        )
    if not report.complete:
        raise FaultFound(
            f"{ranks_word(report.pending)} of job {name!r} did not re-run the call within "
            f"{wait:g}s",
            ranks=report.pending,
        )


def retry_record(reason: str) -> Revocation:
    """The operator's retry of every communicator (empty ``comm``)."""
    return Revocation(
        kind="retry",
        origin=OPERATOR,
        seen_by=OPERATOR,
        via="operator",
        by=operator(),
        reason=reason,
        comm="",
    )


def _retry(
    scoped: ScopedStore, job: str, world_size: int, reason: str, wait_s: float, stale_s: float
) -> RetryReport:
    """Write the record (or find a retry under way), wait for the ranks, read who rejoined."""
    full = scoped.client
    before = latest_epochs(full.list(job_prefix(job) + "retry/"), job)
    if scoped.try_get(KEY) is None:  # acks of a failure a retry got past: not this one's
        for rank in acks_in(full.list(job_prefix(job) + "revoke_ack/"), job):
            scoped.delete(ack_key(rank))
    mine = retry_record(reason).encode()
    held = scoped.compare_set(KEY, None, mine)
    written = held == mine
    try:
        record = decode(held, f"the revoke record of job {job!r}")
    except BadInput as exc:
        raise FaultFound(f"job {job!r} holds a revoke record retry cannot read ({exc})") from None
    if not written and record.kind not in RETRIED:
        raise FaultFound(
            f"job {job!r} already failed: {record.describe()}; only a link fault or an "
            "operator's retry is retried, so retry wrote nothing"
        )
    deadline = time.monotonic() + wait_s
    while True:
        listing = full.list(job_prefix(job))
        after = parse(job, scoped.address, listing)
        rejoined = rejoins_in(listing, job, before, inclusive=not written, world_size=world_size)
        aborted = _aborted(after, world_size)
        view = classify(after, world_size=world_size, thresholds=Thresholds(stale_s=stale_s))
        settled = {r for r, j in rejoined.items() if j.up} | set(aborted)
        if len(settled) >= view.world_size or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    answered = {r: Ack(r) for r in settled | set(rejoined)}  # the others are named why
    culprits = read_culprits(liveness_diagnosis(after, stale_s), view)
    silent = silent_ranks(after, view, culprits, answered)
    return RetryReport(
        job, scoped.address, view.world_size, record, written, wait_s, rejoined, aborted, silent
    )


def _aborted(statuses: JobStatuses, world_size: int) -> dict[int, str]:
    """Ranks whose status shows the operator's retry as an abort (they cannot retry)."""
    found = {}
    for rank, snap in statuses.statuses.items():
        rev = snap.revoke
        if (
            rank < world_size
            and rev is not None
            and rev.kind == "aborted"
            and rev.origin == OPERATOR
            and rev.not_retried
        ):
            found[rank] = rev.not_retried
    return found


def _print(report: RetryReport) -> None:
    console = ui.ResultConsole(highlight=False, soft_wrap=True)
    what = report.record.describe() if report.record is not None else ""
    head = "retried" if report.written else "a retry is under way in"
    console.print(Text(f"{head} job {report.job} ({report.world_size} ranks): {what}"))
    running = report.running
    console.print(Text(f"rejoined: {len(running)} of {report.world_size} ranks", style="green"))
    groups: dict[str, list[int]] = {}
    for rank in sorted(report.rejoined):
        groups.setdefault(report.rejoined[rank].words(), []).append(rank)
    for words, ranks in groups.items():
        console.print(Text(f"  {ranks_word(ranks)}: {words}"))
    for rank, why in sorted(report.aborted.items()):
        console.print(Text(f"  rank {rank}: aborted, cannot retry: {why}", style="yellow"))
    silent = [s for s in report.silent if s.rank not in report.rejoined]
    if silent:
        style = "bold red" if not report.complete else "yellow"
        console.print(Text(f"not rejoined within {report.wait_s:g}s: {len(silent)}", style=style))
    for s in silent:
        where = " ".join(w for w in (s.pid and f"pid {s.pid}", s.host and f"on {s.host}") if w)
        console.print(Text(f"  rank {s.rank}{f' ({where})' if where else ''}: {s.reason}"))
