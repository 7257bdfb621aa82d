"""The slowness signals of ranks known only by their PyTorch Flight Recorder dumps.

``cclctl diagnose slow DIR`` reads the ``signals`` of cclctl's dumps; a rank with only a
Flight Recorder dump among the paths is read here: its entries become windows
(:mod:`~cclctl.diagnose_io.fr_signals`), comms only and no peers, as a torch rank's under
``cclctl run``. A rank that has both kinds of dump is not read twice: cclctl's signals are
its signals. The windows are ``CCLCTL_SLOW_WINDOW`` seconds long (5), or as long as the
cclctl dumps' windows beside them, so every rank's windows line up.

Seqs of the two kinds may count differently (cclctl does not see collectives issued from
C++), so in a folder that has both, the Flight Recorder ranks' communicators are named
apart (``fr:<id>``) and the two kinds are compared only among themselves.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from cclctl import config_values as values
from cclctl import limits
from cclctl.diagnose.slow_model import RankSignals
from cclctl.diagnose.slow_stats import median
from cclctl.diagnose.text import ranks_word
from cclctl.diagnose_io.flight_recorder import find_dumps, gc_paused, parse, rank_of
from cclctl.diagnose_io.fr_signals import FrCalls, calls_of, infer_inside, rank_windows
from cclctl.errors import BadInput
from cclctl.records import RankSnapshot
from cclctl.slow_signals import DEFAULT_WINDOW_S, Signals

#: What every report over Flight Recorder signals says of its source.
SOURCE_NOTE = (
    "from Flight Recorder dumps: entry times only, no per-peer waits: slow links cannot be judged"
)


@dataclasses.dataclass
class FrSignals:
    """The Flight Recorder ranks' signals and what a report should say about them."""

    ranks: list[RankSignals]
    notes: list[str]


def fr_rank_signals(
    paths: Sequence[str], snapshots: Sequence[RankSnapshot], env: dict[str, str] | None = None
) -> FrSignals:
    """Signals of the ranks among ``paths`` that have a Flight Recorder dump and no cclctl
    signals; ``snapshots`` are the job's documents as read (module doc)."""
    files = find_dumps(paths) or []
    ours = [s for s in snapshots if s.signals is not None and s.signals.windows]
    have = {s.rank for s in ours}
    window_s = _window_s(ours, os.environ if env is None else env)
    comm_ids = {s.rank: _comm_ids(s, apart=bool(ours)) for s in snapshots}
    signals: dict[int, Signals] = {}
    untimed: list[int] = []
    notes: list[str] = []
    for path, fmt in files:
        try:
            rank = rank_of(path)
        except BadInput:
            continue  # the dump reader has said so
        if rank in have or rank in signals:
            continue
        try:
            calls = _read_calls(path, fmt)
        except BadInput as exc:
            notes.append(f"rank {rank}: {exc}")
            continue
        if calls.skipped:
            notes.append(
                f"rank {rank}: {calls.skipped:,} Flight Recorder entries skipped ({calls.why})"
            )
        signals[rank] = rank_windows(calls.calls, window_s, comm_ids.get(rank, {}))
        if not calls.timed:
            untimed.append(rank)
    if not signals:
        return FrSignals([], notes)
    infer_inside(signals, untimed)
    ranks = [RankSignals(r, "", s.window_s, s.windows) for r, s in sorted(signals.items())]
    notes.insert(0, f"{ranks_word(signals)}: {SOURCE_NOTE}")
    if untimed:
        notes.append(
            f"{ranks_word(untimed)}: the dumps carry no end times (gloo): time inside calls is "
            "taken as the wait from a rank's entry to the last member's entry"
        )
    notes.append(
        "Flight Recorder times are wall-clock ns per host and its dumps name no host: "
        "entries are compared as if on one clock (no skew margin)"
    )
    if ours:
        notes.append(
            "cclctl's dumps and Flight Recorder dumps are compared only among their own kind "
            "(their seqs may count differently)"
        )
    return FrSignals(ranks, notes)


def _window_s(ours: Sequence[RankSnapshot], env: dict[str, str] | os._Environ[str]) -> float:
    """The cclctl dumps' window, else ``CCLCTL_SLOW_WINDOW`` (ConfigError when bad)."""
    widths = [s.signals.window_s for s in ours if s.signals is not None]
    if widths:
        return median(widths)
    return values.parse(env, "CCLCTL_SLOW_WINDOW", DEFAULT_WINDOW_S, values.slow_window)


def _comm_ids(snap: RankSnapshot, apart: bool) -> dict[str, str]:
    """Group name -> the communicator id its records use (``<name>:<ranks>``)."""
    ids = {cid.rsplit(":", 1)[0]: cid for cid in snap.comms}
    return {name: f"fr:{cid}" for name, cid in ids.items()} if apart else ids


def _read_calls(path: str, fmt: str) -> FrCalls:
    try:
        with open(path, "rb") as fh:
            limits.file_size(fh.fileno(), path, "a Flight Recorder dump")
            data = fh.read()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror or exc})", path=path) from None
    with gc_paused():  # the parsed dump is freed before the collector resumes
        doc = parse(data, fmt, path)
        del data
        if not isinstance(doc, dict):
            raise BadInput(f"{path}: not a Flight Recorder dump", path=path)
        calls = calls_of(doc.get("entries"))
        del doc
    return calls
