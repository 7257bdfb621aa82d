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
from cclctl.diagnose.slow_stats import below, median, others_median_bound
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
        least = opts.min_calls  # of its calls a member ended in the window
        busy = {r: (w, cw) for r, w in views.items()
                if (cw := w.comms.get(name)) is not None and cw.calls >= least}  # fmt: skip
        members = list(busy)
        if len(members) < 2:
            continue
        times = {r: dict(cw.entries) for r, (_, cw) in busy.items()}
        first = times[members[0]].keys()
        if all(t.keys() == first for t in times.values()):  # the usual case: one seq set
            shared = set(first)
        else:
            shared = set.intersection(*(set(t) for t in times.values()))
        if len(shared) < opts.min_calls:
            continue
        shares = {r: min(1.0, cw.inside_ns / max(1, w.end_ns - w.start_ns))  # span_ns
                  for r, (w, cw) in busy.items()}  # fmt: skip
        # a rank whose sampled seqs are all shared keeps its map (the usual case)
        entries = {r: t if len(t) == len(shared) else {s: t[s] for s in shared}
                   for r, t in times.items()}  # fmt: skip
        span = median(span_ns(views[r]) for r in members) / NS
        out.append(CommView(name, shares, entries, span))
    return out


def straggler(
    view: CommView,
    units: Sequence[tuple[int, ...]],
    hosts: Mapping[int, str],
    peers: Mapping[int, Window],
    opts: SlowOptions,
    entry_waits: Sequence[tuple[int, int, int]] | None = None,
) -> Straggle | None:
    """The unit that waits least and arrives last in ``view``, if one does by enough
    (``entry_waits``: :func:`entry_waits` of ``peers``, where already taken)."""
    present = [tuple(r for r in u if r in view.shares) for u in units]
    present = [u for u in present if u]
    if len(present) < 2:
        return None
    shares = {u: float(view.shares[u[0]]) if len(u) == 1 else median(view.shares[r] for r in u)
              for u in present}  # fmt: skip
    waits = {u: ns / NS / view.span_s
             for u, ns in _entry_waits(present, peers, entry_waits).items()}  # fmt: skip
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
    near: list[Sequence[float]] = []
    far: list[Sequence[float]] = []
    if home:
        (here,) = unit_hosts
        for v in others:  # a unit on ``here`` alone is near, judged without the skew
            alone = hosts.get(v[0], "") == here and all(hosts.get(r, "") == here for r in v)
            (near if alone else far).append(times[v])
    else:
        far = [times[v] for v in others]
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
        place = hosts.get(unit[0], "")
        if len(unit) == 1 or all(hosts.get(r, "") == place for r in unit):
            near.setdefault(place, []).append(i)
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


def entry_waits(windows: Mapping[int, Window]) -> list[tuple[int, int, int]]:
    """Every ``(rank, peer, ns)`` where a rank blocked on a peer before it arrived in a
    call (``entry_wait_ns``, not 0): one pass over every rank's peers, shared by the
    window's units of ranks and of hosts."""
    return [(rank, peer, seen.entry_wait_ns) for rank, window in windows.items()
            for peer, seen in window.peers.items() if seen.entry_wait_ns]  # fmt: skip


def _entry_waits(
    units: Sequence[tuple[int, ...]],
    windows: Mapping[int, Window],
    waits: Sequence[tuple[int, int, int]] | None = None,
) -> dict[tuple[int, ...], int]:
    """Per unit, the nanoseconds the other ranks blocked on its ranks before they arrived
    in a call (``waits``: :func:`entry_waits` of ``windows``, where already taken)."""
    unit_of = {r: unit for unit in units for r in unit}
    total = dict.fromkeys(units, 0)
    for rank, peer, ns in entry_waits(windows) if waits is None else waits:
        unit = unit_of.get(peer)
        if unit is not None and unit is not unit_of.get(rank):
            total[unit] += ns
    return total
