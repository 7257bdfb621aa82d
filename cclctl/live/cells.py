"""The words and numbers in one cell of `cclctl top`'s table: a rank's state, whom it waits
on, how its publisher fared with the store, sizes and ages as people read them."""

from __future__ import annotations

from cclctl.live.culprit import Culprits
from cclctl.live.rank_view import ERROR, MISSING, STALE, RankView
from cclctl.ranges import fold_ranks

#: Flags a row's state word already says, so the state cell does not repeat them.
_IMPLIED = {MISSING: {"missing"}, STALE: {"stale"}, ERROR: {"bad_status", "failed"}}
#: "waiting on" cells filled from the diagnosis, not from the rank's own record.
INFERRED = "(inferred)"


def state_text(rank: RankView) -> str:
    """The state word, plus what else looks wrong: "waiting (slow, behind)"."""
    word = rank.state.replace("_", " ")
    if rank.state == ERROR:
        word = "error: bad status" if "bad_status" in rank.flags else f"error: {rank.error}"
    extra = [f for f in rank.flags if f not in _IMPLIED.get(rank.state, set())]
    return f"{word} ({', '.join(extra)})" if extra else word


def waiting_text(rank: RankView, culprits: Culprits) -> str:
    """The peer its record waits on ("2 recv"), else the suspects the diagnosis says it
    waits on ("2 (inferred)"), else "-".
    """
    rec = rank.inflight
    if rec is not None and rec.waiting_on is not None:
        return f"{rec.waiting_on} {rec.waiting_for or ''}".strip()
    suspects = culprits.waits_on.get(rank.rank)
    if suspects:
        return f"{fold_ranks(suspects)} {INFERRED}"
    return "-"


def store_text(rank: RankView) -> str:
    """How the rank's status publisher fared with the store: "-" while it never lost it,
    else the reconnects and the last gap it published through ("1 reconnect, gap 14s")."""
    parts = []
    if rank.store_reconnects:
        plural = "s" if rank.store_reconnects != 1 else ""
        parts.append(f"{rank.store_reconnects} reconnect{plural}")
    if rank.store_gap_s:
        parts.append(f"gap {human_age(rank.store_gap_s)}")
    return ", ".join(parts) or "-"


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
