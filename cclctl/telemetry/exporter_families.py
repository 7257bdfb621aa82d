"""The exporter's metric families of the counters: one consistent copy of the plain
counters, turned into Prometheus metrics at scrape time (see docs/metrics.md for what every
metric means).

:func:`counter_families` is what the collector :mod:`.exporter` registers reads at each
scrape (the last probe's families are in :mod:`.exporter_probe`); the hot path never
touches prometheus_client (no per-call label lookups).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from cclctl.bandwidth import COLLECTIVES
from cclctl.telemetry.counters import DURATION_BOUNDS_NS, ERROR_REASONS, MetricsView, OpStats

_BOUNDS_LE = [floatToGoString(ns / 1e9) for ns in DURATION_BOUNDS_NS] + ["+Inf"]

#: The label naming the training job (``CCLCTL_JOB``). Not ``job``: Prometheus attaches
#: ``job`` and ``instance`` to every series of a target, and would rename ours.
JOB_LABEL = "cclctl_job"
_OP_LABELS = [JOB_LABEL, "rank", "comm", "op"]
_COMM_LABELS = [JOB_LABEL, "rank", "comm"]
_PEER_LABELS = [JOB_LABEL, "rank", "peer"]
RANK_LABELS = [JOB_LABEL, "rank"]


def counter_families(view: MetricsView, base: list[str]) -> Iterator[Metric]:
    """Every family of the counters in ``view``; ``base`` is the job and rank labels."""
    yield from _op_counters(view, base)
    yield from _fault_counters(view, base)
    yield _histogram(view, base)
    yield from _process_metrics(view, base)
    yield from _store_metrics(view, base)


def _op_counters(view: MetricsView, base: list[str]) -> Iterator[Metric]:
    """Counters of completed work, per (comm, op) that has had any call."""

    def family(name: str, doc: str, value: Callable[[OpStats], float]) -> CounterMetricFamily:
        fam = CounterMetricFamily(name, doc, labels=_OP_LABELS)
        for (comm, op), st in sorted(view.ops.items()):
            fam.add_metric([*base, comm, op], value(st))
        return fam

    yield family("cclctl_collectives", "Collectives completed.", lambda st: st.collectives)
    yield family("cclctl_collective_bytes", "Bytes of completed collectives.", lambda st: st.bytes)
    yield family(
        "cclctl_collective_bus_bytes",
        "Bytes of completed collectives times the nccl-tests bus factor.",
        lambda st: st.bus_bytes,
    )
    yield family(
        "cclctl_collective_seconds",
        "Seconds spent inside completed collectives.",
        lambda st: st.busy_ns / 1e9,
    )
    relayed = [(key, st) for key, st in sorted(view.ops.items()) if st.stage_ns]
    if relayed:  # the family exists once a relayed call completed (runtime/relay)
        stages = CounterMetricFamily(
            "cclctl_relay_stage_seconds",
            "Seconds each stage of completed relayed collectives took (d2h, collective, h2d).",
            labels=[*_OP_LABELS, "stage"],
        )
        for (comm, op), st in relayed:
            for stage, ns in sorted(st.stage_ns.items()):
                stages.add_metric([*base, comm, op, stage], ns / 1e9)
        yield stages


def _fault_counters(view: MetricsView, base: list[str]) -> Iterator[Metric]:
    """Errors, hangs and retries, with a zero series for every op (and error reason) on
    every known communicator, so ``increase()`` sees the first fault, not a series born at 1.
    """
    keys = sorted({(c.comm, op) for c in view.comms for op in COLLECTIVES} | set(view.ops))
    idle = OpStats()
    hangs = CounterMetricFamily(
        "cclctl_collective_hangs", "Collectives the watchdog found hung.", labels=_OP_LABELS
    )
    retries = CounterMetricFamily(
        "cclctl_collective_retries", "Collectives retried after a fault.", labels=_OP_LABELS
    )
    errors = CounterMetricFamily(
        "cclctl_collective_errors",
        "Collectives that failed, by reason.",
        labels=[*_OP_LABELS, "reason"],
    )
    for comm, op in keys:
        st = view.ops.get((comm, op), idle)
        hangs.add_metric([*base, comm, op], st.hangs)
        retries.add_metric([*base, comm, op], st.retries)
        for reason in sorted(set(ERROR_REASONS) | set(st.errors)):
            errors.add_metric([*base, comm, op, reason], st.errors.get(reason, 0))
    yield from (errors, hangs, retries)


def _histogram(view: MetricsView, base: list[str]) -> HistogramMetricFamily:
    """Durations of completed collectives per op, summed over communicators."""
    per_op: dict[str, tuple[list[int], int]] = {}
    for (_, op), st in view.ops.items():
        counts, busy = per_op.get(op, ([0] * len(st.buckets), 0))
        per_op[op] = ([a + b for a, b in zip(counts, st.buckets, strict=True)], busy + st.busy_ns)
    fam = HistogramMetricFamily(
        "cclctl_collective_duration_seconds",
        "Duration of completed collectives.",
        labels=[JOB_LABEL, "rank", "op"],
    )
    for op, (counts, busy) in sorted(per_op.items()):
        cumulative, running = [], 0
        for le, n in zip(_BOUNDS_LE, counts, strict=True):
            running += n
            cumulative.append((le, float(running)))
        fam.add_metric([*base, op], cumulative, busy / 1e9)
    return fam


def _process_metrics(view: MetricsView, base: list[str]) -> Iterator[Metric]:
    """The rank's gauges and counters besides the per-op ones: progress, links, health."""
    yield from _collective_progress(view, base)
    yield from _link_bytes(view, base)
    yield from _rank_health(view, base)


def _collective_progress(view: MetricsView, base: list[str]) -> Iterator[Metric]:
    """Per communicator: the last seq started and completed, and the oldest in flight."""
    started = GaugeMetricFamily(
        "cclctl_collective_last_started_seq",
        "Seq of the last collective started.",
        labels=_COMM_LABELS,
    )
    completed = GaugeMetricFamily(
        "cclctl_collective_last_completed_seq",
        "Seq of the last collective completed.",
        labels=_COMM_LABELS,
    )
    inflight = GaugeMetricFamily(
        "cclctl_collective_inflight_start_timestamp_seconds",
        "Start time of the oldest collective in flight (Unix seconds); 0 when idle.",
        labels=_COMM_LABELS,
    )
    for c in sorted(view.comms, key=lambda c: c.comm):
        started.add_metric([*base, c.comm], c.last_started)
        completed.add_metric([*base, c.comm], c.last_completed)
        inflight.add_metric([*base, c.comm], c.inflight_start_ns / 1e9)
    yield from (started, completed, inflight)


def _link_bytes(view: MetricsView, base: list[str]) -> Iterator[Metric]:
    """Bytes sent to and received from each peer rank."""
    sent = CounterMetricFamily(
        "cclctl_link_sent_bytes", "Bytes sent to a peer rank.", labels=_PEER_LABELS
    )
    received = CounterMetricFamily(
        "cclctl_link_received_bytes",
        "Bytes received from a peer rank.",
        labels=_PEER_LABELS,
    )
    resumes = CounterMetricFamily(
        "cclctl_link_resumes",
        "Links to a peer rank made again after a reset, what was lost sent again (no re-run).",
        labels=_PEER_LABELS,
    )
    for peer, (s, r) in sorted(view.links.items()):
        sent.add_metric([*base, str(peer)], s)
        received.add_metric([*base, str(peer)], r)
    for peer, n in sorted(view.link_resumes.items()):
        resumes.add_metric([*base, str(peer)], n)
    yield from (sent, received, resumes)
    yield _peer_waits(view, base)


def _peer_waits(view: MetricsView, base: list[str]) -> CounterMetricFamily:
    """Time blocked on each peer rank this rank waited on, by direction and phase: ``entry``
    before the peer showed progress in the call (it had not arrived), ``data`` after."""
    waits = CounterMetricFamily(
        "cclctl_peer_wait_seconds",
        "Time blocked on a peer rank: direction send or recv; phase entry (before the peer "
        "showed progress in the call) or data (after).",
        labels=[*_PEER_LABELS, "direction", "phase"],
    )
    for peer, (send, recv, entry_send, entry_recv) in sorted(view.peer_waits.items()):
        for direction, phase, ns in (
            ("send", "data", send),
            ("recv", "data", recv),
            ("send", "entry", entry_send),
            ("recv", "entry", entry_recv),
        ):
            if ns:
                waits.add_metric([*base, str(peer), direction, phase], ns / 1e9)
    return waits


def _rank_health(view: MetricsView, base: list[str]) -> Iterator[Metric]:
    """This rank's heartbeat, publish errors, refused link handshakes and identity."""
    heartbeat = GaugeMetricFamily(
        "cclctl_status_heartbeat_timestamp_seconds",
        "Last status heartbeat of this rank (Unix seconds); 0 before the first.",
        labels=RANK_LABELS,
    )
    heartbeat.add_metric(base, view.heartbeat_ns / 1e9)
    publish = CounterMetricFamily(
        "cclctl_status_publish_errors",
        "Status publishes the job's store refused.",
        labels=RANK_LABELS,
    )
    publish.add_metric(base, view.publish_errors)
    refused = CounterMetricFamily(
        "cclctl_link_auth_failures",
        "Link handshakes this rank refused: a bad proof, another job, a rank already linked.",
        labels=RANK_LABELS,
    )
    refused.add_metric(base, view.link_auth_failures)
    info = InfoMetricFamily("cclctl", "cclctl version, host and backend of this rank.")
    info.add_metric(
        [JOB_LABEL, "rank", "version", "host", "backend"],
        {
            JOB_LABEL: view.job,
            "rank": base[1],
            "version": view.version,
            "host": view.host,
            "backend": view.backend,
        },
    )
    yield from (heartbeat, publish, refused, info)


def _store_metrics(view: MetricsView, base: list[str]) -> Iterator[Metric]:
    """What the job's store turned away, on the rank that hosts it (see docs/metrics.md)."""
    if view.store is None:
        return
    rejected = CounterMetricFamily(
        "cclctl_store_rejected_connections",
        "Connections the job's store closed, by reason (a limit, a wrong token).",
        labels=[*RANK_LABELS, "reason"],
    )
    for reason, count in sorted(view.store.rejected.items()):
        rejected.add_metric([*base, reason], count)
    refused = CounterMetricFamily(
        "cclctl_store_refused_requests",
        "Requests the job's store refused to clients without the job's token.",
        labels=RANK_LABELS,
    )
    refused.add_metric(base, view.store.refused)
    yield from (rejected, refused)
