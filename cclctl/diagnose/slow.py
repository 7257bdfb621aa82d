"""``analyse()``: which rank, link or host makes a running job slow, from per-rank windows.

Pure: plain values in (:class:`RankSignals`, one per rank), a :class:`SlowReport` out.

Windows of different ranks are matched by their index (``start_ns // window``: each rank
cuts them on its own clock at multiples of the window since the epoch), so they line up
to the clock skew between hosts. Each window is judged on its own (``slow_ranks``: the
rank, or the host's ranks together, that arrives last and waits least; ``slow_links``:
the directed links, or a host's every link out or in, whose throughput falls below the
others of their kind: over TCP by their messages' transfer times, which no lateness
upstream touches), and a suspect becomes a finding only when it is found in ``confirm``
consecutive windows (2 by default), every one costing the job at least ``min_slowdown``
(1.15x), or, for a straggler that costs less (from ``sustained_slowdown``, 1.05x), in
``confirm_sustained`` (5): a +15% compute slowdown of one rank whose step is mostly
compute, but also communication, slows the job by less than 15%, on evidence that holds
window after window. So jitter (no rank is consistently last), a busy machine (it slows
every rank alike), a GC pause or one long step (one window) are never a finding.

Clock skew: entry times are wall clock, compared across ranks only for the same call
(communicator and seq). Ranks on one host share a clock. An entry on another host counts
as later only beyond ``SlowOptions.skew_s`` (2 ms by default, what NTP keeps a LAN to),
and every finding rests first on clock-free signals: the share of each window spent
inside calls and the links' bytes over their transfer times or data-phase waits. Skew
beyond the window itself misaligns windows and is not tolerated.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Mapping, Sequence

from cclctl.diagnose import slow_links, slow_ranks, slow_text
from cclctl.diagnose.slow_model import (
    HEALTHY,
    SLOW,
    UNJUDGED,
    RankFigures,
    RankSignals,
    SlowOptions,
    SlowReport,
    span_ns,
)
from cclctl.diagnose.slow_stats import median, sorted_median
from cclctl.slow_signals import Window

#: A suspect: ("rank", (r,)), ("host", name) for its ranks, ("link", (src, dst)),
#: ("egress" or "ingress", host).
Key = tuple[str, object]


@dataclasses.dataclass
class Judged:
    """One window: whether it could be judged, its suspects with their evidence, and what
    its figures are taken from (only the newest judged window's are shown)."""

    index: int
    judged: bool
    suspects: dict[Key, object]
    views: Mapping[int, Window]
    comms: Sequence[slow_ranks.CommView]

    def figures(self) -> dict[int, RankFigures]:
        return _figures(self.views, self.comms)


def analyse(
    ranks: Sequence[RankSignals],
    job: str = "",
    source: str = "live",
    options: SlowOptions | None = None,
    notes: Sequence[str] = (),
) -> SlowReport:
    """The slow-job verdict over every rank's windows (see the module doc)."""
    opts = options or SlowOptions()
    window_s = median(r.window_s for r in ranks) if ranks else 0.0
    report = SlowReport(job, source, UNJUDGED, "", [], 0, window_s, len(ranks), {}, opts,
                        list(notes))  # fmt: skip
    if not ranks or window_s <= 0:
        report.reason = "no rank publishes signals (an older cclctl, or none has run a window)"
        return report
    hosts = {r.rank: r.host for r in ranks}
    judged = [_judge(i, views, hosts, opts) for i, views in _aligned(ranks, window_s)]
    done = [j for j in judged if j.judged]
    report.windows_judged = len(done)
    if done:
        report.figures = done[-1].figures()
    complete = max(len(r.windows) for r in ranks)
    if complete < opts.confirm:
        report.reason = (
            f"too young to judge: {_windows(complete, window_s)} complete; "
            f"a finding needs {opts.confirm} in a row"
        )
        return report
    if len(done) < opts.confirm:
        report.reason = (
            f"too idle to judge: {len(done)} of {len(judged)} windows had {opts.min_calls} calls "
            "of a communicator on two ranks or two links of a kind carrying 64 KiB (TCP) or "
            "256 KiB"
        )
        return report
    runs = _confirmed(judged, opts)
    pids = {r.rank: r.pid for r in ranks}
    report.findings = slow_text.findings(runs, hosts, pids, window_s, opts)
    report.status = SLOW if report.findings else HEALTHY
    report.reason = slow_text.reason(report, len(set(hosts.values())))
    return report


def _windows(count: int, window_s: float) -> str:
    return f"{count} window{'s' if count != 1 else ''} of {window_s:g}s"


def _aligned(ranks: Sequence[RankSignals], window_s: float) -> list[tuple[int, dict[int, Window]]]:
    """Windows by index, oldest first; each maps rank -> that rank's window. Windows newer
    than some rank's newest are left out: that rank has not published them yet (statuses
    are read at different moments), and judging without it would compare the others alone.
    """
    width = max(1, int(window_s * 1e9))
    by_index: dict[int, dict[int, Window]] = {}
    newest = []
    for rank in ranks:
        for window in rank.windows:
            by_index.setdefault(window.start_ns // width, {})[rank.rank] = window
        if rank.windows:
            newest.append(rank.windows[-1].start_ns // width)
    upto = min(newest, default=0)
    return sorted((i, views) for i, views in by_index.items() if i <= upto)


def _judge(
    index: int, views: Mapping[int, Window], hosts: Mapping[int, str], opts: SlowOptions
) -> Judged:
    suspects: dict[Key, object] = {}
    comms = slow_ranks.comm_views(views, opts) if len(views) >= 2 else []
    singles = [(r,) for r in sorted(views)]
    by_host = _host_units(views, hosts)
    waits = slow_ranks.entry_waits(views) if comms else []
    for view in comms:
        found = slow_ranks.straggler(view, singles, hosts, views, opts, waits)
        if found is not None:
            suspects.setdefault(("rank", found.ranks), found)
        if len(by_host) >= 2:
            group = slow_ranks.straggler(view, by_host, hosts, views, opts, waits)
            if group is not None and len(group.ranks) >= 2:
                suspects.setdefault(("host", hosts[group.ranks[0]]), group)
    # a straggler's lateness runs along chains of waits: links judged by waits sit it out
    links = slow_links.links(views, hosts, straggler=bool(suspects))
    for slow in slow_links.slow_links(links, opts):
        suspects[("link", (slow.link.src, slow.link.dst))] = slow
    for edge in slow_links.slow_edges(links, hosts, opts):
        suspects[("egress" if edge.direction == "out" else "ingress", edge.host)] = edge
    kinds = [x.kind for x in links]
    judged = bool(comms) or any(kinds.count(k) >= 2 for k in kinds)
    return Judged(index, judged, suspects, views, comms)


def _host_units(views: Mapping[int, Window], hosts: Mapping[int, str]) -> list[tuple[int, ...]]:
    groups: dict[str, list[int]] = {}
    for rank in sorted(views):
        groups.setdefault(hosts.get(rank, ""), []).append(rank)
    return [tuple(g) for g in groups.values()]


def _figures(
    views: Mapping[int, Window], comms: Sequence[slow_ranks.CommView]
) -> dict[int, RankFigures]:
    """Each rank's entry lag in the busiest judged communicator and its share inside calls."""
    lags: dict[int, float] = {}
    if comms:
        busiest = max(comms, key=lambda v: (len(next(iter(v.entries.values()))), v.comm))
        lags = rank_lags(busiest)
    out = {}
    for rank, window in sorted(views.items()):
        inside = sum(c.inside_ns for c in window.comms.values())
        out[rank] = RankFigures(lags.get(rank), min(1.0, inside / span_ns(window)))
    return out


def confirms(run: Sequence[object], opts: SlowOptions) -> bool:
    """Whether a suspect's run of consecutive windows (oldest first) makes a finding: its
    newest ``confirm`` windows each cost the job the minimum effect, or it is a straggler
    found in ``confirm_sustained`` windows (and at least ``confirm``) at a smaller one."""
    if len(run) >= opts.confirm and all(_costly(e) for e in run[-opts.confirm :]):
        return True
    return all(isinstance(e, slow_ranks.Straggle) for e in run) and len(run) >= max(
        opts.confirm, opts.confirm_sustained
    )


def _costly(evidence: object) -> bool:
    """A link or host's evidence always is (it is found at the minimum effect only)."""
    return not isinstance(evidence, slow_ranks.Straggle) or evidence.costly


def _confirmed(judged: Sequence[Judged], opts: SlowOptions) -> dict[Key, list[object]]:
    """Suspects whose run of consecutive windows :func:`confirms` them: the evidence of each
    window of their run (the newest run; with ``ongoing``, only runs through the newest
    judged window). A window that could not be judged, or a gap between indexes, breaks a
    run."""
    runs: dict[Key, list[object]] = {}
    best: dict[Key, list[object]] = {}
    previous: int | None = None
    for window in judged:
        if not window.judged or (previous is not None and window.index != previous + 1):
            runs = {}
        previous = window.index
        runs = {k: [*runs.get(k, []), e] for k, e in window.suspects.items()}
        for key, run in runs.items():
            if confirms(run, opts):
                best[key] = run
    if opts.ongoing:
        newest = next((j for j in reversed(judged) if j.judged), None)
        best = {k: v for k, v in best.items() if newest is not None and k in newest.suspects
                and v[-1] is newest.suspects[k]}  # fmt: skip
    return best


def rank_lags(view: slow_ranks.CommView) -> dict[int, float]:
    """Each member's median lag, in seconds, behind the median entry of the members."""
    seqs = sorted(next(iter(view.entries.values())))
    rows = view.entries
    centres = [median(map(operator.itemgetter(seq), rows.values())) for seq in seqs]
    ns = itertools.repeat(slow_ranks.NS)
    # per rank (times[seq] - centre) / NS for each seq, mapped in C (a job of 100,000 ranks)
    return {
        rank: sorted_median(
            sorted(
                map(operator.truediv, map(operator.sub, map(times.__getitem__, seqs), centres), ns)
            )
        )
        for rank, times in rows.items()
    }
