"""The last probe as evidence for a slow-job verdict: measured links beside inferred ones.

``diagnose slow`` infers a slow link from the job's own traffic (bytes over the time both
ends blocked); ``cclctl probe`` measures every directed link alone. When the job published
a probe (:mod:`cclctl.probe_record`), :func:`join` adds to each ``slow_link`` finding what
the probe saw of the same directed link (flagged too: confirmed; measured within its
bounds: not confirmed, the link may be slow only under the job's load), to a ``slow_host``
finding the probe's verdict on that host, and lists the probe's findings that no finding of
the signals names (a flagged link the job's traffic does not use, an unreachable pair).
The probe never changes the verdict: it is a measurement taken at its own time, which the
evidence states. Pure: records in, records out.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cclctl.diagnose.slow_model import SlowFinding, SlowReport
from cclctl.probe_record import ProbeFinding, ProbeRecord

SLOW_LINK, SLOW_HOST = "slow_link", "slow_host"


@dataclasses.dataclass(frozen=True)
class ProbeEvidence:
    """What the last probe adds: when it ran, how many links it had, how many of the
    signals' findings it confirmed, and its findings the signals did not name."""

    time_ns: int
    age_s: float | None
    links: int
    findings: int
    confirmed: int
    unnamed: tuple[ProbeFinding, ...]

    def headline(self) -> str:
        """``probe 2m05s ago: 56 links, 1 finding (0 named by the signals)``."""
        words = f"probe {age_words(self.age_s)}: {self.links} links"
        if not self.findings:
            return f"{words}, all passed"
        plural = "s" if self.findings != 1 else ""
        return f"{words}, {self.findings} finding{plural}, {self.confirmed} confirming the signals"

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_ns": self.time_ns,
            "age_s": None if self.age_s is None else round(self.age_s, 3),
            "links": self.links,
            "findings": self.findings,
            "confirmed": self.confirmed,
            "unnamed": [dataclasses.asdict(f) for f in self.unnamed],
        }


def join(
    report: SlowReport, probe: ProbeRecord | None, now_ns: int
) -> tuple[SlowReport, ProbeEvidence | None]:
    """``report`` with the probe's word added to its findings' evidence, and the
    evidence; the report unchanged and None without a probe."""
    if probe is None:
        return report, None
    age = (now_ns - probe.time_ns) / 1e9 if probe.time_ns and now_ns >= probe.time_ns else None
    when = f"the probe {age_words(age)}"
    findings: list[SlowFinding] = []
    confirmed = 0
    named: set[int] = set()
    for finding in report.findings:
        words, matched = _about(finding, probe, when)
        named.update(matched)
        confirmed += bool(matched)
        extra = [words] if words else []
        findings.append(dataclasses.replace(finding, evidence=[*finding.evidence, *extra]))
    unnamed = tuple(f for i, f in enumerate(probe.findings) if i not in named)
    evidence = ProbeEvidence(
        time_ns=probe.time_ns,
        age_s=age,
        links=probe.links_total,
        findings=len(probe.findings),
        confirmed=confirmed,
        unnamed=unnamed,
    )
    return dataclasses.replace(report, findings=findings), evidence


def _about(finding: SlowFinding, probe: ProbeRecord, when: str) -> tuple[str, list[int]]:
    """The probe's word on one finding, and the probe's findings that confirm it."""
    if finding.kind == SLOW_LINK and finding.link is not None:
        src, dst = finding.link
        same = [i for i, f in enumerate(probe.findings) if (f.src, f.dst) == (src, dst)
                and f.kind == SLOW_LINK]  # fmt: skip
        if same:
            return f"confirmed by {when}: {probe.findings[same[0]].text}", same
        link = probe.link(src, dst)
        if link is None:
            return "", []
        if link.flagged:  # flagged as part of a slow host
            host = [i for i, f in enumerate(probe.findings) if f.kind == SLOW_HOST
                    and f.host in (probe.host(src), probe.host(dst))]  # fmt: skip
            text = probe.findings[host[0]].text if host else "flagged"
            return f"confirmed by {when}: {text}", host
        if link.status != "ok":
            return f"{when} could not measure it: {link.status}", []
        median = probe.medians.get(link.kind)
        figure = bandwidth_words(link.bandwidth)
        ratio = f", {link.bandwidth / median:.2f}× its kind's median" if (
            median and link.bandwidth is not None) else ""  # fmt: skip
        return (f"not confirmed by {when}: it measured {figure}{ratio}, within its bounds "
                "(the link may be slow only under the job's load)"), []  # fmt: skip
    if finding.kind == SLOW_HOST and finding.host:
        same = [i for i, f in enumerate(probe.findings)
                if f.kind == SLOW_HOST and f.host == finding.host]  # fmt: skip
        if same:
            return f"confirmed by {when}: {probe.findings[same[0]].text}", same
        ranks = [r for r, h in enumerate(probe.hosts) if h == finding.host]
        bad = [x for x in probe.links if not x.passed and (x.src in ranks or x.dst in ranks)]
        if bad:
            return f"{when} flagged {len(bad)} of this host's links", []
        if any(x.src in ranks or x.dst in ranks for x in probe.links):
            return f"not confirmed by {when}: every link of this host it measured passed", []
    return "", []


def age_words(age_s: float | None) -> str:
    """``12s ago``, ``5m03s ago``, ``2h07m ago``; ``at an unknown time`` without one."""
    if age_s is None:
        return "at an unknown time"
    if age_s < 60:
        return f"{age_s:.0f}s ago"
    minutes, secs = divmod(int(age_s), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s ago"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m ago"


def bandwidth_words(bytes_per_s: float | None) -> str:
    """``23 MB/s``, ``1.25 GB/s`` (decimal, as the probe prints them)."""
    if bytes_per_s is None:
        return "-"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= scale:
            value = bytes_per_s / scale
            return f"{value:.3g} {unit}"
    return f"{bytes_per_s:.3g} B/s"
