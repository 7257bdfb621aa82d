"""Which directed links, and which hosts, are slow or unreachable: the probe's verdicts.

A measured link is flagged when it is below every bound that applies to it:

- the job-relative bound of its kind (shared memory, TCP within a host, TCP across hosts):
  ``median - k * MAD`` of the links' log bandwidths (links differ by factors, not amounts, so
  a few very slow links cannot drag the bound below zero; the MAD scaled by 1.4826, so ``k``
  counts standard deviations of a normal spread) and never above a third of the median, so
  neither a tight spread nor a loaded machine's noise flags a link at half its peers' speed.
  It needs :data:`MIN_PEERS` measured links of the kind;
- ``--min-bw``, an absolute floor, when given;
- the baseline, when given: the median of the same kind in an earlier run's document, less
  ``tolerance``.

A link no bound applies to is never flagged (one TCP link alone, no floor, no baseline): the
verdict says so. A host whose every link to other hosts in one direction is flagged, with at
least two other hosts to compare, is named as the host (``slow_host``: egress or ingress);
its links are then not listed one by one. A pair whose transfers failed is ``unreachable``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence

from cclctl.probe.model import KIND_WORDS, OK, SKIPPED, UNREACHABLE, Link, ProbeRun
from cclctl.probe.units import format_bw, format_ratio

MAD_SCALE = 1.4826
#: The relative bound is never above this share of the median.
RELATIVE_CEILING = 1 / 3
#: Measured links of one kind needed before the job-relative bound applies.
MIN_PEERS = 3
DEFAULT_K = 3.0
DEFAULT_TOLERANCE = 0.25
SLOW_LINK, SLOW_HOST, UNREACHABLE_KIND = "slow_link", "slow_host", "unreachable"


@dataclasses.dataclass(frozen=True)
class Bounds:
    """What a link is judged against: ``k`` MADs, the floor, the baseline's medians by kind."""

    k: float = DEFAULT_K
    min_bw: float | None = None
    baseline: Mapping[str, float] = dataclasses.field(default_factory=dict)
    tolerance: float = DEFAULT_TOLERANCE


@dataclasses.dataclass(frozen=True)
class KindStats:
    kind: str
    count: int
    median: float
    mad: float  # of the natural logs of the bandwidths: a spread by factors
    bound: float | None  # the relative bound; None below MIN_PEERS links

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing to tell: a slow link, a slow host, an unreachable pair."""

    kind: str
    text: str
    src: int | None = None
    dst: int | None = None
    host: str | None = None
    direction: str | None = None  # a host's egress or ingress
    bandwidth: float | None = None
    median: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class Verdict:
    flagged: frozenset[tuple[int, int]]
    stats: Mapping[str, KindStats]
    findings: tuple[Finding, ...]
    unjudged: tuple[str, ...]  # kinds no bound applied to

    @property
    def ok(self) -> bool:
        return not self.findings


def kind_stats(links: Sequence[Link], k: float = DEFAULT_K) -> dict[str, KindStats]:
    """Median, MAD and relative bound (``k`` MADs) of each kind's measured bandwidths."""
    by_kind: dict[str, list[float]] = {}
    for link in links:
        if link.measured and link.bandwidth is not None:
            by_kind.setdefault(link.kind, []).append(link.bandwidth)
    return {kind: _stats(kind, values, k) for kind, values in sorted(by_kind.items())}


def _stats(kind: str, values: list[float], k: float) -> KindStats:
    median = statistics.median(values)
    logs = [math.log(v) for v in values if v > 0]
    mad = statistics.median(abs(x - math.log(median)) for x in logs) if logs and median > 0 else 0.0
    bound = None
    if len(values) >= MIN_PEERS:
        bound = min(median * math.exp(-k * MAD_SCALE * mad), median * RELATIVE_CEILING)
    return KindStats(kind, len(values), median, mad, bound)


def is_flagged(link: Link, stats: KindStats | None, bounds: Bounds) -> bool | None:
    """True below every bound that applies, False above one; None: no bound applies."""
    if not link.measured or link.bandwidth is None:
        return False
    tests: list[bool] = []
    if stats is not None and stats.bound is not None:
        tests.append(link.bandwidth < stats.bound)
    if bounds.min_bw is not None:
        tests.append(link.bandwidth < bounds.min_bw)
    base = bounds.baseline.get(link.kind)
    if base is not None:
        tests.append(link.bandwidth < base * (1 - bounds.tolerance))
    return all(tests) if tests else None


def judge(run: ProbeRun, bounds: Bounds | None = None) -> Verdict:
    """Flag the run's links and word what was found."""
    bounds = bounds or Bounds()
    stats = kind_stats(run.links, bounds.k)
    flagged: set[tuple[int, int]] = set()
    unjudged: set[str] = set()
    for link in run.links:
        verdict = is_flagged(link, stats.get(link.kind), bounds)
        if verdict:
            flagged.add((link.src, link.dst))
        elif verdict is None and link.measured:
            unjudged.add(link.kind)
    findings = _unreachable(run)
    hosts, absorbed = _slow_hosts(run, flagged, stats)
    findings += hosts
    findings += [
        _slow_link(run, link, stats, flagged)
        for link in run.links
        if (link.src, link.dst) in flagged and (link.src, link.dst) not in absorbed
    ]
    return Verdict(frozenset(flagged), stats, tuple(findings), tuple(sorted(unjudged)))


def _unreachable(run: ProbeRun) -> list[Finding]:
    """One finding per pair that did not answer (either direction)."""
    seen: set[tuple[int, int]] = set()
    found = []
    for link in run.links:
        pair = (min(link.src, link.dst), max(link.src, link.dst))
        if link.status not in (UNREACHABLE, SKIPPED) or pair in seen:
            continue
        seen.add(pair)
        a, b = pair
        text = f"rank {a} <-> rank {b} ({run.host(a)} <-> {run.host(b)}): {link.status}"
        found.append(Finding(UNREACHABLE_KIND, f"{text}: {link.why}" if link.why else text, a, b))
    return found


def _slow_hosts(
    run: ProbeRun, flagged: set[tuple[int, int]], stats: Mapping[str, KindStats]
) -> tuple[list[Finding], set[tuple[int, int]]]:
    """Hosts whose every measured link to other hosts, out of them or into them, is flagged
    (with two other hosts or more to compare), and the links they explain."""
    found: list[Finding] = []
    absorbed: set[tuple[int, int]] = set()
    for host in sorted(set(run.hosts[r] for r in run.participants)):
        for direction in ("egress", "ingress"):
            links = [
                x for x in run.links
                if x.measured and run.host(x.src) != run.host(x.dst)
                and run.host(x.src if direction == "egress" else x.dst) == host
            ]  # fmt: skip
            others = {run.host(x.dst if direction == "egress" else x.src) for x in links}
            if len(others) < 2 or not all((x.src, x.dst) in flagged for x in links):
                continue
            absorbed.update((x.src, x.dst) for x in links)
            found.append(_host_finding(host, direction, links, stats))
    return found, absorbed


def _host_finding(
    host: str, direction: str, links: list[Link], stats: Mapping[str, KindStats]
) -> Finding:
    bws = [x.bandwidth for x in links if x.bandwidth is not None]
    worst = statistics.median(bws)
    kind = links[0].kind
    median = stats[kind].median if kind in stats else None
    way = "out of" if direction == "egress" else "into"
    text = (
        f"host {host}: every link {way} it is slow ({len(links)} links, median {format_bw(worst)}"
    )
    if median:
        text += (
            f", {format_ratio(worst / median)} the median of {stats[kind].count} "
            f"{KIND_WORDS.get(kind, kind)} links"
        )
    text += f"): the host's {direction}, not one link"
    return Finding(SLOW_HOST, text, host=host, direction=direction, bandwidth=worst,
                   median=median)  # fmt: skip


def _slow_link(
    run: ProbeRun, link: Link, stats: Mapping[str, KindStats], flagged: set[tuple[int, int]]
) -> Finding:
    bw = link.bandwidth or 0.0
    where = f"({run.host(link.src)} -> {run.host(link.dst)})"
    text = f"rank {link.src} -> rank {link.dst} {where}: {format_bw(bw)}"
    st = stats.get(link.kind)
    if st is not None and st.median > 0:
        text += (
            f", {format_ratio(bw / st.median)} the median of {st.count} "
            f"{KIND_WORDS.get(link.kind, link.kind)} links"
        )
    text += f"; {_reverse(run, link, flagged)}"
    return Finding(SLOW_LINK, text, link.src, link.dst, bandwidth=bw,
                   median=st.median if st else None)  # fmt: skip


def _reverse(run: ProbeRun, link: Link, flagged: set[tuple[int, int]]) -> str:
    back = run.link(link.dst, link.src)
    if run.direction == "both":
        return "both directions were measured at once: rerun with --direction each to tell which"
    if back is None or back.status != OK:
        return "reverse direction not measured"
    if (back.src, back.dst) in flagged:
        return "reverse direction slow too"
    return "reverse direction normal"
