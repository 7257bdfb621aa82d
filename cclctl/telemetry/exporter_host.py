"""The host agent's Prometheus endpoint: one scrape target per host, one series set per rank.

At 10,000 ranks a scrape target per rank is 10,000 targets; Prometheus' guidance at that
size is one exporter per host. The host agent (:mod:`cclctl.runtime.hostagent`) serves this
collector over the statuses its ranks send it, so each series is what the ranks' statuses
say, labelled by ``cclctl_job``, ``host`` and ``rank`` (as a rank's own exporter labels
its series), with a bounded set per rank: its counters (collectives, bytes,
errors, retries, hangs, link resumes), its last bus bandwidth per collective, its seqs per
communicator, the age of its status; and the agent's own writes. A rank's full families
(per-op histograms, per-peer bytes and waits) stay on its own exporter
(``CCLCTL_METRICS_PORT``), for a closer look at one host. See docs/metrics.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from cclctl.telemetry.http_serve import MetricsHTTPServer

#: (status counter, metric name, help) for every counter a status carries
_COUNTERS = (
    ("collectives", "cclctl_rank_collectives", "Collectives the rank completed"),
    ("bytes", "cclctl_rank_bytes", "Bytes of the rank's buffers in its collectives"),
    ("errors", "cclctl_rank_errors", "Collectives that failed on the rank"),
    ("retries", "cclctl_rank_retries", "Collectives the rank re-ran after a link fault"),
    ("hangs", "cclctl_rank_hangs", "Calls the rank's watchdog expired"),
    ("link_resumes", "cclctl_rank_link_resumes", "Links the rank made again in a step"),
)


_AGENT_COUNTERS = (
    ("writes", "Host documents the agent wrote to the job's store"),
    ("write_errors", "Writes of the host document that failed"),
    ("refused", "Connections of another user the agent turned away"),
)


class HostCollector:
    """Families over the host's ranks' statuses (rank -> decoded status) and the agent's
    own counts, read at scrape time."""

    def __init__(
        self,
        job: str,
        host: str,
        statuses: Callable[[], Mapping[int, Any]],
        agent_counts: Callable[[], Mapping[str, int]],
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.job = job
        self.host = host
        self._statuses = statuses
        self._agent_counts = agent_counts
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        statuses = {r: s for r, s in self._statuses().items() if isinstance(s, dict)}
        now = self._clock()
        labels = ["cclctl_job", "host", "rank"]
        for field, name, what in _COUNTERS:
            family = CounterMetricFamily(name, what, labels=labels)
            for rank, doc in sorted(statuses.items()):
                value = _number(_counters(doc).get(field))
                if value is not None:
                    family.add_metric([self.job, self.host, str(rank)], value)
            yield family
        busbw = GaugeMetricFamily(
            "cclctl_rank_last_busbw_gbps",
            "Bus bandwidth of the rank's last call of each collective (GB/s)",
            labels=[*labels, "op"],
        )
        seq = GaugeMetricFamily(
            "cclctl_rank_seq",
            "The last seq the rank started and completed on each communicator",
            labels=[*labels, "comm", "state"],
        )
        age = GaugeMetricFamily(
            "cclctl_rank_status_age_seconds",
            "Seconds since the rank built the status its agent holds",
            labels=labels,
        )
        for rank, doc in sorted(statuses.items()):
            ids = [self.job, self.host, str(rank)]
            last = _counters(doc).get("last_busbw_gbps")
            for op, value in sorted(last.items()) if isinstance(last, dict) else ():
                if (number := _number(value)) is not None:
                    busbw.add_metric([*ids, str(op)], number)
            comms = doc.get("comms")
            for comm, info in sorted(comms.items()) if isinstance(comms, dict) else ():
                for state in ("started", "completed"):
                    value = info.get(f"last_{state}") if isinstance(info, dict) else None
                    if (number := _number(value)) is not None:
                        seq.add_metric([*ids, str(comm), state], number)
            if (built := _number(doc.get("time_ns"))) is not None:
                age.add_metric(ids, max(0.0, (now - built) / 1e9))
        yield from (busbw, seq, age)
        counts = self._agent_counts()
        host = ["cclctl_job", "host"]
        for key, what in _AGENT_COUNTERS:
            family = CounterMetricFamily(f"cclctl_host_agent_{key}", what, labels=host)
            family.add_metric([self.job, self.host], counts.get(key, 0))
            yield family
        ranks = GaugeMetricFamily(
            "cclctl_host_agent_ranks", "Ranks connected to the host's agent now", labels=host
        )
        ranks.add_metric([self.job, self.host], counts.get("connected", 0))
        yield ranks


def _counters(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    counters = doc.get("counters")
    return counters if isinstance(counters, dict) else {}


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def serve_host_metrics(collector: HostCollector, addr: str, port: int) -> MetricsHTTPServer:
    """Serve ``collector`` at ``http://addr:port/metrics`` (OSError when the port is taken)."""
    registry = CollectorRegistry()
    registry.register(collector)
    server = MetricsHTTPServer(lambda: generate_latest(registry), CONTENT_TYPE_LATEST)
    server.start(addr, port)
    return server
