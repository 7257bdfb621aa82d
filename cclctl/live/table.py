"""The job view as table rows of plain text, ready for any renderer (rich lives in commands/).

Only the rows that fit are built: with 1,000 ranks the screen shows the suspects first and
a line counting the rest, and the cost of a refresh does not grow with rows nobody sees.
Columns that do not fit the width are dropped whole, by :data:`PRIORITY` (a cut number or
op name would mislead): ops are first abbreviated to their short forms, then columns go.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime

from cclctl.diagnose.model import MISSING as NO_STATUS
from cclctl.diagnose.report import suspects_line
from cclctl.live.cells import human_age, human_bytes, state_text, store_text, waiting_text
from cclctl.live.culprit import SUSPECT, Culprits, display_order
from cclctl.live.rank_view import MISSING, JobView, RankView

COLUMNS = (
    "rank",
    "host",
    "pid",
    "heartbeat",
    "state",
    "comm",
    "seq",
    "op",
    "size",
    "age",
    "waiting on",
    "busbw GB/s",
    "errors",
    "retries",
    "resumes",
    "store",
)
NUMERIC = frozenset(
    (
        "rank",
        "pid",
        "heartbeat",
        "seq",
        "size",
        "age",
        "busbw GB/s",
        "errors",
        "retries",
        "resumes",
    )
)
#: Which columns stay when the width runs out, first to last; rank and state always stay.
PRIORITY = (
    "rank",
    "state",
    "seq",
    "op",
    "waiting on",
    "age",
    "heartbeat",
    "comm",
    "pid",
    "host",
    "size",
    "errors",
    "retries",
    "resumes",
    "busbw GB/s",
    "store",
)
#: The columns of link faults ridden through: calls re-run, links made again mid-call. One
#: that counts any comes right after the culprit's own columns, since a faulty link is
#: what such a screen is about.
RIDDEN = ("retries", "resumes")
#: How many of :data:`PRIORITY`'s first columns (the culprit's own) stay ahead of them.
CULPRIT_COLUMNS = 5
ALWAYS = frozenset(("rank", "state"))
#: Short forms of collectives (as NCCL users write them), used when full names do not fit.
SHORT_OPS = {
    "all_reduce": "ar",
    "all_gather": "ag",
    "reduce_scatter": "rs",
    "all_to_all": "a2a",
    "all_to_allv": "a2av",
    "alltoall": "a2a",
    "broadcast": "bcast",
}
#: The state column wraps (never cuts) beyond this width, so one long error keeps the rest.
STATE_MAX = 40
#: Characters between two columns as the renderer draws them (a cell's right padding and
#: the box's blank rule).
COLUMN_GAP = 2


@dataclasses.dataclass(frozen=True)
class Row:
    """One rank's cells; ``severity`` is one of :data:`cclctl.live.culprit.HIGHLIGHTS`."""

    rank: int
    cells: tuple[str, ...]
    severity: str


@dataclasses.dataclass(frozen=True)
class Table:
    """Header, verdict lines (the diagnosis' faults, then who waits on whom), rows, footer."""

    header: str
    columns: tuple[str, ...]
    rows: list[Row]
    footer: str  # "" when every rank has a row
    verdicts: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (label, words)
    waiting: list[str] = dataclasses.field(default_factory=list)
    #: columns a screen is about (a slow job's entry lag and wait share), kept right after
    #: the culprit's own columns; any other column not in :data:`PRIORITY` goes last
    promoted: tuple[str, ...] = ()

    def fit(self, width: int) -> Table:
        """The columns that fit ``width`` characters, in display order (see :data:`PRIORITY`)."""
        keep, short = _fit_columns(self, width)
        index = [i for i, name in enumerate(self.columns) if name in keep]
        op = self.columns.index("op") if "op" in self.columns else -1

        def cell(i: int, value: str) -> str:
            return SHORT_OPS.get(value, value) if short and i == op else value

        rows = [
            Row(r.rank, tuple(cell(i, r.cells[i]) for i in index), r.severity) for r in self.rows
        ]
        columns = tuple(self.columns[i] for i in index)
        return dataclasses.replace(self, columns=columns, rows=rows)


def _order(model: Table) -> tuple[str, ...]:
    """:data:`PRIORITY`, with the :data:`RIDDEN` columns that count anything moved up."""
    counted = [
        name
        for i, name in enumerate(model.columns)
        if name in RIDDEN and any(r.cells[i] not in ("0", "-") for r in model.rows)
    ]
    head = PRIORITY[:CULPRIT_COLUMNS]
    rest = (c for c in PRIORITY[CULPRIT_COLUMNS:] if c not in counted)
    return (*head, *model.promoted, *counted, *rest)


def _fit_columns(model: Table, width: int) -> tuple[set[str], bool]:
    """Greedy by priority: a column is kept if it fits whole; ops shorten before they go."""
    widths = {
        name: max([len(name), *(len(r.cells[i]) for r in model.rows)])
        for i, name in enumerate(model.columns)
    }
    widths["state"] = min(widths["state"], STATE_MAX)
    op = model.columns.index("op") if "op" in model.columns else -1
    short_op = max([len("op"), *(len(SHORT_OPS.get(r.cells[op], r.cells[op])) for r in model.rows)])
    keep: set[str] = set()
    used = -COLUMN_GAP
    short = False
    order = _order(model)
    for name in sorted(model.columns, key=lambda name: _priority(name, order)):
        need = widths[name] + COLUMN_GAP
        if name == "op" and used + need > width and used + short_op + COLUMN_GAP <= width:
            need, short = short_op + COLUMN_GAP, True
        if name in ALWAYS or used + need <= width:
            keep.add(name)
            used += need
    return keep, short


def _priority(name: str, order: tuple[str, ...] = PRIORITY) -> int:
    base = "busbw GB/s" if name.startswith("busbw") else name
    return order.index(base) if base in order else len(order)


def build_table(
    view: JobView, culprits: Culprits, max_rows: int | None = None, slow: int = 0
) -> Table:
    """Rows for the first ``max_rows`` ranks in display order (all when None); ``slow``:
    how many findings ``diagnose slow`` has for the same statuses (the header says so)."""
    order = display_order(view, culprits)
    shown = order if max_rows is None else order[: max(0, max_rows)]
    busbw_op = _common_op(view.ranks)
    at = COLUMNS.index("busbw GB/s")  # titled with the op it compares
    columns = (
        COLUMNS if not busbw_op else (*COLUMNS[:at], f"busbw GB/s {busbw_op}", *COLUMNS[at + 1 :])
    )
    rows = [_row(rank, culprits, busbw_op) for rank in shown]
    footer = _footer(order[len(shown) :], culprits)
    verdicts = verdict_lines(culprits)
    return Table(
        header(view, culprits, slow), columns, rows, footer, verdicts, list(culprits.waiting_lines)
    )


def verdict_lines(culprits: Culprits) -> list[tuple[str, str]]:
    """(label, words) per finding, worded as ``diagnose hang`` words it: ``("NOT ENTERED",
    "rank 2 never entered all_reduce seq 155 of comm 0:0-3 · rank 2 (pid 7 on node-1)")``;
    none when healthy.
    """
    lines = []
    for verdict in culprits.faults:
        who = suspects_line(verdict)
        words = f"{verdict.summary} · {who}" if who else verdict.summary
        lines.append((verdict.kind.replace("_", " ").upper(), words))
    return lines


def header(view: JobView, culprits: Culprits, slow: int = 0) -> str:
    """The job, its ranks and where it stands: by the verdicts and rows below it (the
    hang diagnosis', and ``slow`` findings of the slow one: :meth:`Culprits.standing`),
    never by a count of its own."""
    when = datetime.datetime.fromtimestamp(view.fetched_ns / 1e9).strftime("%H:%M:%S")
    size_note = {"flag": " (from --world-size)", "ranks": " (highest rank seen + 1)"}.get(
        view.world_size_source, ""
    )
    return (
        f"job {view.job} · {view.seen}/{view.world_size} ranks{size_note} · "
        f"{culprits.standing(view.ranks, slow)} · "
        f"store {view.address} · {when}"
    )


def _footer(rest: list[RankView], culprits: Culprits) -> str:
    if not rest:
        return ""
    words = culprits.counted(rest)
    more = f"... and {len(rest)} more rank{'s' if len(rest) != 1 else ''}"
    return f"{more} ({', '.join(words)})" if words else f"{more} ok"


def _common_op(ranks: list[RankView]) -> str:
    """The op most ranks report a bus bandwidth for, so one column compares like with like."""
    counts = collections.Counter(op for r in ranks for op in r.busbw_gbps)
    if not counts:
        return ""
    return min(counts, key=lambda op: (-counts[op], op))


def _row(rank: RankView, culprits: Culprits, busbw_op: str) -> Row:
    rec = rank.inflight
    known = rank.state != MISSING and "bad_status" not in rank.flags
    if rec is not None:
        where = (rec.comm, str(rec.seq), rec.op, human_bytes(rec.nbytes))
        age = human_age(rank.inflight_age_s)
    else:
        last = max(rank.comms.items(), key=lambda kv: kv[1].last_completed, default=None)
        where = (last[0], str(last[1].last_completed), "-", "-") if last else ("-",) * 4
        age = "-"
    busbw = rank.busbw_gbps.get(busbw_op)
    severity = culprits.highlight(rank)
    state = state_text(rank)
    if severity == SUSPECT and culprits.reasons[rank.rank][0] != NO_STATUS:
        state = culprits.reasons[rank.rank][1]  # a missing rank's state says more: why
    cells = (
        str(rank.rank),
        rank.host or "-",
        str(rank.pid) if known else "-",
        human_age(rank.heartbeat_age_s),
        state,
        *where,
        age,
        waiting_text(rank, culprits),
        "-" if busbw is None else f"{busbw:.2f}",
        str(rank.errors) if known else "-",
        str(rank.retries) if known else "-",
        str(rank.resumes) if known else "-",
        store_text(rank),
    )
    return Row(rank.rank, cells, severity)
