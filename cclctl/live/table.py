"""The job view as table rows of plain text, ready for any renderer (rich lives in commands/).

Only the rows that fit are built: with 1,000 ranks the screen shows the wrong ones first and
a line counting the rest, and the cost of a refresh does not grow with rows nobody sees.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime

from cclctl.live.classify import ERROR, MISSING, STALE, JobView, RankView

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
)
NUMERIC = frozenset(
    ("rank", "pid", "heartbeat", "seq", "size", "age", "busbw GB/s", "errors", "retries")
)

#: Flags a row's state word already says, so the state cell does not repeat them.
_IMPLIED = {MISSING: {"missing"}, STALE: {"stale"}, ERROR: {"bad_status", "failed"}}


@dataclasses.dataclass(frozen=True)
class Row:
    """One rank's cells; ``severity`` is "bad" (dead, frozen, failed), "warn" or "ok"."""

    rank: int
    cells: tuple[str, ...]
    severity: str


@dataclasses.dataclass(frozen=True)
class Table:
    header: str
    columns: tuple[str, ...]
    rows: list[Row]
    footer: str  # "" when every rank has a row


def build_table(view: JobView, max_rows: int | None = None) -> Table:
    """Rows for the first ``max_rows`` ranks in view order (all when None)."""
    shown = view.ranks if max_rows is None else view.ranks[: max(0, max_rows)]
    busbw_op = _common_op(view.ranks)
    columns = COLUMNS if not busbw_op else (*COLUMNS[:-3], f"busbw GB/s {busbw_op}", *COLUMNS[-2:])
    rows = [_row(rank, busbw_op) for rank in shown]
    return Table(header(view), columns, rows, _footer(view.ranks[len(shown) :]))


def header(view: JobView) -> str:
    when = datetime.datetime.fromtimestamp(view.fetched_ns / 1e9).strftime("%H:%M:%S")
    size_note = {"flag": " (from --world-size)", "ranks": " (highest rank seen + 1)"}.get(
        view.world_size_source, ""
    )
    wrong = f"{view.wrong} look wrong" if view.wrong else "all look fine"
    return (
        f"job {view.job} · {view.seen}/{view.world_size} ranks{size_note} · {wrong} · "
        f"store {view.address} · {when}"
    )


def _footer(rest: list[RankView]) -> str:
    if not rest:
        return ""
    wrong = sum(1 for r in rest if r.wrong)
    more = f"... and {len(rest)} more rank{'s' if len(rest) != 1 else ''}"
    return f"{more} ok" if not wrong else f"{more} ({wrong} look wrong)"


def _common_op(ranks: list[RankView]) -> str:
    """The op most ranks report a bus bandwidth for, so one column compares like with like."""
    counts = collections.Counter(op for r in ranks for op in r.busbw_gbps)
    if not counts:
        return ""
    return min(counts, key=lambda op: (-counts[op], op))


def state_text(rank: RankView) -> str:
    """The state word, plus what else looks wrong: "waiting (slow, behind)"."""
    word = rank.state.replace("_", " ")
    if rank.state == ERROR:
        word = "error: bad status" if "bad_status" in rank.flags else f"error: {rank.error}"
    extra = [f for f in rank.flags if f not in _IMPLIED.get(rank.state, set())]
    return f"{word} ({', '.join(extra)})" if extra else word


def _row(rank: RankView, busbw_op: str) -> Row:
    rec = rank.inflight
    known = rank.state != MISSING and "bad_status" not in rank.flags
    if rec is not None:
        where = (rec.comm, str(rec.seq), rec.op, human_bytes(rec.nbytes))
        age = human_age(rank.inflight_age_s)
        waiting = "-" if rec.waiting_on is None else f"{rec.waiting_on} {rec.waiting_for or ''}"
    else:
        last = max(rank.comms.items(), key=lambda kv: kv[1].last_completed, default=None)
        where = (last[0], str(last[1].last_completed), "-", "-") if last else ("-",) * 4
        age, waiting = "-", "-"
    busbw = rank.busbw_gbps.get(busbw_op)
    cells = (
        str(rank.rank),
        rank.host or "-",
        str(rank.pid) if known else "-",
        human_age(rank.heartbeat_age_s),
        state_text(rank),
        *where,
        age,
        waiting.strip(),
        "-" if busbw is None else f"{busbw:.2f}",
        str(rank.errors) if known else "-",
        str(rank.retries) if known else "-",
    )
    severity = "bad" if rank.severe else "warn" if rank.wrong else "ok"
    return Row(rank.rank, cells, severity)


def human_bytes(nbytes: int) -> str:
    """``1536`` -> ``"1.5 KiB"``: short, binary units, as people size buffers."""
    if nbytes < 1024:
        return f"{nbytes} B"
    size = float(nbytes)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            break
    return f"{size:.0f} {unit}" if size == int(size) else f"{size:.1f} {unit}"


def human_age(seconds: float | None) -> str:
    """``0.25`` -> ``"250ms"``, ``75`` -> ``"1m15s"``, ``None`` -> ``"-"``."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
