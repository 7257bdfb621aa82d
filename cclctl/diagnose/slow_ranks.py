"""A compute straggler in one window: the unit (a rank, or a host's ranks together) that
arrives last and waits least.

A rank that computes longer enters each collective after the others, who wait for it
inside the call; it never waits for them. So per communicator, against the other units:
its share of the window spent inside calls is lower than theirs by more than the job is
allowed to lose (``SlowOptions.min_share``) and by more than ``mad_k`` scaled MADs of
their shares (clock-free), and it arrives last: it entered last in at least
``last_share`` of the sampled calls every member recorded (entry times are compared on
each rank's own wall clock: an entry on another host counts as later only beyond
``skew_s``), or the others blocked on it before it arrived in their calls (their
``entry_wait_ns`` on it, clock-free) more than on any other unit, beyond ``mad_k`` MADs.
The second holds where the sampled seqs miss the late calls (a step of two calls whose
second starts together on every rank, sampled at even seqs only). What the others lose is
the gap between their share and its share: the job would save that much of each window
if it kept up, so the estimated slowdown is ``1 / (1 - gap)``.

A unit is a suspect from ``SlowOptions.sustained_share`` on (the lowest effect any run of
windows can confirm); it is ``costly`` when it passes the same tests at ``min_share``,
the effect two windows confirm (``slow.confirms`` decides which run is enough). A suspect
below that may also show its arrival by entering last in more of the shared calls than
any other unit: a straggler late into one call of a step of two enters last in half of
them, while the others' waits on it spread along the chains of a ring. The longer run of
windows it needs answers for the weaker test.

Durations alone cannot see this: the others' calls last longer, not the straggler's.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence

from cclctl.diagnose.slow_model import SlowOptions, span_ns
from cclctl.diagnose.slow_stats import below, median, others_median_bound, sorted_median
from cclctl.slow_signals import Window

NS = 1e9


@dataclasses.dataclass(frozen=True)
class Straggle:
    """A unit found arriving last and waiting least in one communicator of one window."""

    ranks: tuple[int, ...]
    comm: str
    share: float  # its share of the window inside the comm's calls
    others_share: float  # the median of the other units' shares
    last_frac: float  # of the shared sampled calls, the share it entered last
    seqs: int  # shared sampled calls
    lag_s: float  # median of how long after the others' median entry it entered
    entry_wait_share: float  # others' waits on it before it arrived, over the window
    entered_last: bool = True  # its entry times show it (else the others' entry waits do)
    costly: bool = True  # it costs the job ``min_share`` or more (else only ``sustained_share``)
    last_most: bool = False  # it entered last in more shared calls than any other unit

    @property
    def cost(self) -> float:
        return self.others_share - self.share


@dataclasses.dataclass(frozen=True)
class CommView:
    """One communicator of one window: its members' shares inside and shared entries."""

    comm: str
    shares: dict[int, float]  # by rank
    entries: dict[int, dict[int, int]]  # rank -> seq -> enter_ns, the shared seqs only
    span_s: float


def comm_views(views: Mapping[int, Window], opts: SlowOptions) -> list[CommView]:
    """The communicators of one window that can be judged: at least two members that each
    ended ``min_calls`` of its calls there and share ``min_calls`` sampled entries."""
    names = sorted({c for w in views.values() for c in w.comms})
    out = []
    for name in names:
        members = [r for r, w in views.items() if _busy(w, name, opts)]
        if len(members) < 2:
            continue
        times = {r: dict(views[r].comms[name].entries) for r in members}
        shared = set.intersection(*(set(t) for t in times.values()))
        if len(shared) < opts.min_calls:
            continue
        shares = {r: min(1.0, views[r].comms[name].inside_ns / span_ns(views[r])) for r in members}
        # a rank whose sampled seqs are all shared keeps its map (the usual case)
        entries = {r: t if len(t) == len(shared) else {s: t[s] for s in shared}
                   for r, t in times.items()}  # fmt: skip
        span = median(span_ns(views[r]) for r in members) / NS
        out.append(CommView(name, shares, entries, span))
    return out


def _busy(window: Window, comm: str, opts: SlowOptions) -> bool:
    cw = window.comms.get(comm)
    return cw is not None and cw.calls >= opts.min_calls


def straggler(
    view: CommView,
    units: Sequence[tuple[int, ...]],
    hosts: Mapping[int, str],
    peers: Mapping[int, Window],
    opts: SlowOptions,
) -> Straggle | None:
    """The unit that waits least and arrives last in ``view``, if one does by enough."""
    present = [tuple(r for r in u if r in view.shares) for u in units]
    present = [u for u in present if u]
    if len(present) < 2:
        return None
    shares = {u: float(view.shares[u[0]]) if len(u) == 1 else median(view.shares[r] for r in u)
              for u in present}  # fmt: skip
    waits = {u: ns / NS / view.span_s for u, ns in _entry_waits(present, peers).items()}
    best: Straggle | None = None
    counts: dict[tuple[int, ...], int] | None = None
    times: dict[tuple[int, ...], list[float]] | None = None
    bound = others_median_bound(shares.values())
    for unit in present:
        if bound - shares[unit] <= opts.sustained_share:
            continue  # below no leave-one-out median by the smallest share a finding needs
        others = [v for v in present if v != unit]
        theirs = [shares[v] for v in others]
        if not below(shares[unit], theirs, opts.mad_k, opts.sustained_share):
            continue
        times = times if times is not None else unit_times(view, present)
        last, lag = _arrival(times, unit, others, hosts, opts)
        entered_last = last >= opts.last_share and lag > 0
        counts = counts if counts is not None else last_counts(view, present, hosts, opts, times)
        most = lag > 0 and all(counts[unit] > counts[v] for v in others)
        if not (entered_last or most or _waited_for(unit, others, waits, opts.sustained_share,
                                                    opts)):  # fmt: skip
            continue
        costly = below(shares[unit], theirs, opts.mad_k, opts.min_share) and (
            entered_last or _waited_for(unit, others, waits, opts.min_share, opts)
        )
        found = Straggle(
            unit,
            view.comm,
            shares[unit],
            median(shares[v] for v in others),
            last,
            len(next(iter(view.entries.values()))),
            lag,
            waits[unit],
            entered_last,
            costly,
            most,
        )
        if best is None or (found.costly, found.cost) > (best.costly, best.cost):
            best = found
    return best


def _waited_for(
    unit: tuple[int, ...],
    others: Sequence[tuple[int, ...]],
    waits: Mapping[tuple[int, ...], float],
    floor: float,
    opts: SlowOptions,
) -> bool:
    """Clock-free: the others blocked on ``unit``, before it arrived, more than on anyone
    else, by ``floor`` of a window shared among them and by ``mad_k`` MADs."""
    least = floor / len(others)
    return below(-waits[unit], [-waits[v] for v in others], opts.mad_k, least)


Unit = tuple[int, ...]


def unit_times(view: CommView, units: Sequence[Unit]) -> dict[Unit, list[float]]:
    """Each unit's entry time in each shared call, oldest seq first: the median of its
    ranks' (one pass over the entries, shared by :func:`_arrival` and :func:`last_counts`)."""
    seqs = sorted(next(iter(view.entries.values())))
    out: dict[Unit, list[float]] = {}
    for unit in units:
        if len(unit) == 1:
            row = view.entries[unit[0]]
            out[unit] = list(map(float, map(row.__getitem__, seqs)))  # a median of one
        else:
            rows = [view.entries[r] for r in unit]
            out[unit] = [median(row[seq] for row in rows) for seq in seqs]
    return out


def _arrival(
    times: Mapping[tuple[int, ...], Sequence[float]],
    unit: tuple[int, ...],
    others: Sequence[tuple[int, ...]],
    hosts: Mapping[int, str],
    opts: SlowOptions,
) -> tuple[float, float]:
    """The share of shared calls ``unit`` entered last, and its median lag in seconds
    (``times``: :func:`unit_times`)."""
    skew = int(opts.skew_s * NS)
    unit_hosts = {hosts.get(r, "") for r in unit}
    home = unit_hosts == {hosts.get(unit[0], "")}  # on one host: its others there, no skew
    near = [times[v] for v in others if home and {hosts.get(r, "") for r in v} == unit_hosts]
    far = [times[v] for v in others if not (home and {hosts.get(r, "") for r in v} == unit_hosts)]
    last = 0
    lags = []
    calls = len(times[unit])
    for mine, close, away in zip(times[unit], _columns(near, calls), _columns(far, calls),
                                 strict=True):  # fmt: skip
        # after every other unit: the latest of each kind, beyond its margin, decides
        if mine > max(close, default=-math.inf) and mine > max(away, default=-math.inf) + skew:
            last += 1
        lags.append((mine - median(close + away)) / NS)
    return last / len(lags), median(lags)


def _columns(rows: Sequence[Sequence[float]], calls: int) -> Iterator[tuple[float, ...]]:
    """The units' times call by call: one tuple per call (empty ones for no units)."""
    return zip(*rows, strict=True) if rows else itertools.repeat((), calls)


def last_counts(
    view: CommView,
    units: Sequence[tuple[int, ...]],
    hosts: Mapping[int, str],
    opts: SlowOptions,
    times: Mapping[tuple[int, ...], Sequence[float]] | None = None,
) -> dict[tuple[int, ...], int]:
    """How many of the shared calls each unit entered last, after every other unit (by
    more than ``skew_s`` where the two are not on one host); a call no unit entered last
    by that margin counts for none. ``times``: :func:`unit_times`, where already taken."""
    skew = int(opts.skew_s * NS)
    rows = times if times is not None else unit_times(view, units)
    # the units judged against each other without the skew: those on one and the same
    # host (a unit on several hosts is judged with the skew against every other)
    near: dict[str, list[int]] = {}
    for i, unit in enumerate(units):
        place = {hosts.get(r, "") for r in unit}
        if len(place) == 1:
            near.setdefault(place.pop(), []).append(i)
    group = {i: g for g in near.values() for i in g}
    counts = dict.fromkeys(units, 0)
    for column in zip(*(rows[u] for u in units), strict=True):
        top = max(column)
        late = column.index(top)  # the first unit at the latest time
        mine = group.get(late, [late])
        rest = list(column)
        for i in mine:
            rest[i] = -math.inf
        far = max(rest)  # the latest entry of a unit judged with the skew
        close = max((column[i] for i in mine if i != late), default=-math.inf)
        if top > close and top > far + skew:
            counts[units[late]] += 1
    return counts


def _entry_waits(
    units: Sequence[tuple[int, ...]], windows: Mapping[int, Window]
) -> dict[tuple[int, ...], int]:
    """Per unit, the nanoseconds the other ranks blocked on its ranks before they arrived
    in a call: one pass over every rank's peers (a job of thousands of ranks)."""
    unit_of = {r: unit for unit in units for r in unit}
    total = dict.fromkeys(units, 0)
    for rank, window in windows.items():
        mine = unit_of.get(rank)
        for peer, seen in window.peers.items():
            unit = unit_of.get(peer)
            if unit is not None and unit is not mine:
                total[unit] += seen.entry_wait_ns
    return total


def rank_lags(view: CommView) -> dict[int, float]:
    """Each member's median lag, in seconds, behind the median entry of the members."""
    seqs = sorted(next(iter(view.entries.values())))
    rows = view.entries
    centres = [median(times[seq] for times in rows.values()) for seq in seqs]
    pairs = list(zip(seqs, centres, strict=True))
    return {
        rank: sorted_median(sorted([(times[seq] - centre) / NS for seq, centre in pairs]))
        for rank, times in rows.items()
    }
