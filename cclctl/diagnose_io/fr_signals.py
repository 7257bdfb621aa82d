"""PyTorch Flight Recorder entries as slowness signals, so ``diagnose slow`` reads FR dumps.

A Flight Recorder entry says, per collective, its process group, its ``collective_seq_id``
and ``time_created_ns``: when the rank issued the call, on the rank's wall clock (ns since
the epoch, per host, like the entry times of :mod:`cclctl.slow_signals`). That is the entry time
the straggler analysis compares at equal (communicator, seq). Some backends also say when
the call ended (``time_discovered_completed_ns``, or ``duration_ms`` with timing on);
gloo says neither. :func:`rank_windows` folds one rank's entries into the windows a torch
rank publishes under ``cclctl run`` (comms only, no peers): per communicator the calls
that ended in each window, the time inside them where their ends are known, and sampled
entry times (:func:`~cclctl.slow_signals.sample_entries`, so every rank keeps the same seqs).
Only complete windows count: the ones holding the rank's first and last entry are partial
and left out; the newest :data:`~cclctl.slow_signals.MAX_WINDOWS` are kept.

Where no end is known, :func:`infer_inside` fills the time inside calls from the ranks'
entries together: a member's call of a seq cannot end before the last member entered it,
so the time from its entry to the last member's entry is a lower bound of its time inside
(the wait for a straggler, all of it). Computed on the sampled seqs and scaled to the
window's calls. Entry times of different hosts compare only up to their clocks' skew,
which dumps do not let cclctl measure (they name no host).

Pure: plain data in (a parsed dump's ``entries``), :class:`~cclctl.slow_signals.Signals` out;
entries that cannot be used (not a mapping, no integer seq, a time out of range) are
skipped and counted, never raised on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

from cclctl.slow_signals import MAX_COMMS, MAX_WINDOWS, CommWindow, Signals, Window, sample_entries

#: Times after this (ns since the epoch, the year 2262) are not a clock's: skipped.
MAX_TIME_NS = (1 << 63) - 1
#: Seqs beyond this are corrupt, not counts.
MAX_SEQ = 1 << 62
#: The longest call a dump may state (a day, in ms); longer durations are ignored.
MAX_DURATION_MS = 86_400_000.0


@dataclasses.dataclass(frozen=True, slots=True)
class FrCall:
    """One collective as a dump states it: its group's name, seq, entry and end (0: not
    known) on the rank's wall clock."""

    group: str
    seq: int
    enter_ns: int
    end_ns: int = 0


@dataclasses.dataclass
class FrCalls:
    """One rank's usable collectives, how many entries were skipped and why (the first
    reason met), and how many point-to-point entries were left aside."""

    calls: list[FrCall]
    skipped: int = 0
    why: str = ""
    p2p: int = 0

    @property
    def timed(self) -> bool:
        """Whether any call's end is known (else :func:`infer_inside` gives the time)."""
        return any(c.end_ns for c in self.calls)


def _int(value: object) -> int | None:
    """An int from a field that may be an int or its digits (JSON dumps write strings)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and 0 < len(value) <= 20 and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _group(entry: Mapping[str, object]) -> str | None:
    """The group's name: ``process_group`` is (name, desc); else ``pg_id``."""
    pg = entry.get("process_group")
    if isinstance(pg, list | tuple) and len(pg) == 2 and isinstance(pg[0], str) and pg[0]:
        return pg[0][:200]
    pg_id = _int(entry.get("pg_id"))
    return None if pg_id is None else str(pg_id)


def _end(entry: Mapping[str, object], enter: int) -> int:
    """When the call ended, if the entry says and it is plausible; else 0."""
    done = _int(entry.get("time_discovered_completed_ns"))
    if done is not None and enter <= done <= MAX_TIME_NS:
        return done
    ms = entry.get("duration_ms")
    if isinstance(ms, bool) or not isinstance(ms, int | float):
        return 0
    if math.isfinite(ms) and 0 <= ms <= MAX_DURATION_MS:
        return min(MAX_TIME_NS, enter + int(ms * 1e6))
    return 0


def calls_of(entries: object) -> FrCalls:
    """The usable collectives among a dump's ``entries`` (see the module doc)."""
    out = FrCalls([])
    if not isinstance(entries, list):
        out.why = "field 'entries' is not a list"
        return out

    def skip(why: str) -> None:
        out.skipped += 1
        out.why = out.why or why

    for entry in entries:
        if not isinstance(entry, dict):
            skip("an entry is not a mapping")
            continue
        if entry.get("is_p2p") is True:
            out.p2p += 1
            continue
        group = _group(entry)
        seq = _int(entry.get("collective_seq_id"))
        enter = _int(entry.get("time_created_ns"))
        if group is None:
            skip("an entry names no process group")
        elif seq is None or not 0 <= seq <= MAX_SEQ:
            skip("an entry has no usable collective_seq_id")
        elif enter is None or not 0 < enter <= MAX_TIME_NS:
            skip("an entry has no usable time_created_ns")
        else:
            out.calls.append(FrCall(group, seq, enter, _end(entry, enter)))
    return out


def rank_windows(calls: Sequence[FrCall], window_s: float, comms: Mapping[str, str]) -> Signals:
    """One rank's complete windows of ``window_s`` seconds from its calls (module doc).

    ``comms`` maps a group's name to the communicator id the rank's records use (the name
    itself where it has none), so the windows of every rank name their communicators alike.
    """
    window_ns = max(1, int(window_s * 1e9))
    if not calls:
        return Signals(window_s, [])
    first = min(c.enter_ns for c in calls) // window_ns
    last = max(max(c.enter_ns, c.end_ns) for c in calls) // window_ns
    lo = max(first + 1, last - MAX_WINDOWS)  # the complete windows, the newest kept
    open_: dict[int, dict[str, CommWindow]] = {i: {} for i in range(lo, last)}
    entries: dict[tuple[int, str], list[tuple[int, int]]] = {}
    names = _kept_names(calls, comms)
    for call in calls:
        name = names.get(call.group)
        if name is None:
            continue
        entered = call.enter_ns // window_ns
        ended = (call.end_ns or call.enter_ns) // window_ns
        if entered in open_:
            entries.setdefault((entered, name), []).append((call.seq, call.enter_ns))
        if ended in open_:
            _comm(open_[ended], name).calls += 1
        if call.end_ns:
            for index in range(max(entered, lo), min(ended, last - 1) + 1):
                start, stop = index * window_ns, (index + 1) * window_ns
                inside = min(call.end_ns, stop) - max(call.enter_ns, start)
                _comm(open_[index], name).inside_ns += max(0, inside)
    for (index, name), found in entries.items():
        _comm(open_[index], name).entries = sample_entries(found)
    windows = [Window(i * window_ns, (i + 1) * window_ns, open_[i]) for i in range(lo, last)]
    return Signals(window_s, windows)


def _kept_names(calls: Iterable[FrCall], comms: Mapping[str, str]) -> dict[str, str]:
    """Group name -> communicator id, for the :data:`MAX_COMMS` busiest groups."""
    counts: dict[str, int] = {}
    for call in calls:
        counts[call.group] = counts.get(call.group, 0) + 1
    busiest = sorted(counts, key=lambda g: (-counts[g], g))[:MAX_COMMS]
    return {g: comms.get(g, g) for g in busiest}


def _comm(comms: dict[str, CommWindow], name: str) -> CommWindow:
    found = comms.get(name)
    if found is None:
        found = comms[name] = CommWindow()
    return found


def infer_inside(ranks: Mapping[int, Signals], untimed: Iterable[int]) -> None:
    """Fill, in place, the time inside calls of the ``untimed`` ranks' windows: per window
    and communicator, the mean over its sampled seqs that another rank shares of how long
    after the rank's entry the last member entered, times the window's calls, at most the
    window (see the module doc). Windows match by start, as every rank cuts them alike."""
    by_start: dict[tuple[int, str], dict[int, dict[int, int]]] = {}
    for rank, signals in ranks.items():
        for window in signals.windows:
            for name, comm in window.comms.items():
                by_start.setdefault((window.start_ns, name), {})[rank] = dict(comm.entries)
    for rank in untimed:
        for window in ranks[rank].windows:
            span = window.end_ns - window.start_ns
            for name, comm in window.comms.items():
                members = by_start.get((window.start_ns, name), {})
                mine = members.get(rank, {})
                waits = []
                for seq, enter in mine.items():
                    theirs = [m[seq] for r, m in members.items() if r != rank and seq in m]
                    if theirs:
                        waits.append(max(0, max(theirs) - enter))
                if waits and comm.calls:
                    comm.inside_ns = min(span, sum(waits) * comm.calls // len(waits))
