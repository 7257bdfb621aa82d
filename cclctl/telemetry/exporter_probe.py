"""The exporter's metric families of the last probe a rank ran (see docs/metrics.md).

Rank 0 of a probe inside the job hands its record to telemetry
(:meth:`cclctl.telemetry.hub.Telemetry.set_probe`); these families publish it at scrape
time, beside the counters' (:mod:`.exporter_families`).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from cclctl.telemetry.counters import MetricsView
from cclctl.telemetry.exporter_families import RANK_LABELS

#: Links of the last probe a rank publishes as series, those that did not pass first (a
#: 32-rank job's full matrix is 992 links); the rest are counted in cclctl_probe_links.
MAX_PROBE_SERIES = 1024
_PROBE_LINK_LABELS = [*RANK_LABELS, "src", "dst", "kind"]


def probe_metrics(view: MetricsView, base: list[str]) -> Iterator[Metric]:
    """The last probe's links, on the rank that ran it (rank 0 of a probe inside the job):
    when it ended, how many links it had and found by kind, and per directed link (up to
    :data:`MAX_PROBE_SERIES`) its bandwidth, latency and whether it was flagged."""
    probe = view.probe
    if probe is None:
        return
    when = GaugeMetricFamily(
        "cclctl_probe_timestamp_seconds",
        "When the last probe ended (Unix seconds).",
        labels=RANK_LABELS,
    )
    when.add_metric(base, probe.time_ns / 1e9)
    links = GaugeMetricFamily(
        "cclctl_probe_links", "Directed links the last probe had.", labels=RANK_LABELS
    )
    links.add_metric(base, probe.links_total)
    findings = GaugeMetricFamily(
        "cclctl_probe_findings",
        "The last probe's findings, by kind (slow_link, slow_host, unreachable).",
        labels=[*RANK_LABELS, "kind"],
    )
    kinds = ("slow_link", "slow_host", "unreachable")
    for kind in sorted(set(kinds) | {f.kind for f in probe.findings}):
        findings.add_metric([*base, kind], sum(1 for f in probe.findings if f.kind == kind))
    bandwidth = GaugeMetricFamily(
        "cclctl_probe_link_bandwidth_bytes_per_second",
        "Bandwidth the last probe measured on a directed link (src sends to dst).",
        labels=_PROBE_LINK_LABELS,
    )
    latency = GaugeMetricFamily(
        "cclctl_probe_link_latency_seconds",
        "Latency (half the median round trip of small messages) the last probe measured.",
        labels=_PROBE_LINK_LABELS,
    )
    flagged = GaugeMetricFamily(
        "cclctl_probe_link_flagged",
        "1 when the last probe flagged a directed link slow or found it unreachable, else 0.",
        labels=_PROBE_LINK_LABELS,
    )
    shown = sorted(probe.links, key=lambda x: (x.passed, x.src, x.dst))[:MAX_PROBE_SERIES]
    for link in sorted(shown, key=lambda x: (x.src, x.dst)):
        labels = [*base, str(link.src), str(link.dst), link.kind]
        if link.bandwidth is not None:
            bandwidth.add_metric(labels, link.bandwidth)
        if link.latency is not None:
            latency.add_metric(labels, link.latency)
        flagged.add_metric(labels, 0 if link.passed else 1)
    yield from (when, links, findings, bandwidth, latency, flagged)
