"""docs/metrics.md and the Grafana dashboard stay in step with what the exporter serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from telemetry_helpers import run

from cclctl import probe_record
from cclctl.records import FAILED
from cclctl.telemetry.counters import StoreCounts
from cclctl.telemetry.exporter import MetricsExporter
from cclctl.telemetry.exporter_families import JOB_LABEL
from cclctl.telemetry.exporter_host import HostCollector

ROOT = Path(__file__).resolve().parents[2]
METRIC = re.compile(r"\bcclctl_[a-z_]+")
#: A probe of two ranks, one link measured and one unreachable.
PROBE = {
    "schema": "cclctl.probe", "version": 1, "world_size": 2, "hosts": ["h0", "h1"],
    "time_ns": 1, "links": [
        {"src": 0, "dst": 1, "kind": "tcp", "status": "ok", "bandwidth": 1e9,
         "latency": 1e-5, "flagged": False},
        {"src": 1, "dst": 0, "kind": "tcp", "status": "unreachable", "flagged": False},
    ],
    "findings": [{"kind": "unreachable", "text": "rank 0 <-> rank 1", "src": 0, "dst": 1}],
}  # fmt: skip


def metrics_in(text: str) -> set[str]:
    """The metric names ``text`` mentions (the job label shares their prefix)."""
    return set(METRIC.findall(text)) - {JOB_LABEL}


def exposed(make_tel) -> tuple[set[str], set[str]]:
    """(family names, sample names) of a scrape where every kind of metric has a sample."""
    tel = make_tel()
    run(tel, "w", 1)
    run(tel, "w", 2, state=FAILED)
    run(tel, "w/relay", 1).stages.update(d2h=1, collective=2, h2d=1)  # counted at the render
    tel.link_bytes(1, 1, 1)
    tel.peer_waits.add(1, 0, 1000)  # time blocked sending to rank 1
    tel.add_resume_source(lambda: [0, 1])  # a link to rank 1 made again once
    tel.add_store_source(lambda: StoreCounts({"idle": 1}, 2))  # as on the store's rank
    tel.set_probe(probe_record.from_dict(PROBE))  # as on the rank that ran the last probe
    text = MetricsExporter(tel.metrics_view).render().decode()
    status = {"time_ns": 1, "counters": {name: 1 for name in ("collectives", "bytes", "errors",
              "retries", "hangs", "link_resumes")} | {"last_busbw_gbps": {"all_reduce": 1.0}},
              "comms": {"0:0-1": {"last_started": 1, "last_completed": 1}}}  # fmt: skip
    host = HostCollector("j", "h", lambda: {0: status}, lambda: {"writes": 1})  # the host agent's
    registry = CollectorRegistry()
    registry.register(host)
    text += generate_latest(registry).decode()
    families = list(text_string_to_metric_families(text))
    return {f.name for f in families}, {s.name for f in families for s in f.samples}


def test_docs_describe_every_metric_and_no_other(make_tel):
    families, samples = exposed(make_tel)
    doc = (ROOT / "docs" / "metrics.md").read_text()
    table = {m for line in doc.splitlines() if line.startswith("| `") for m in metrics_in(line)}
    counters = {s for s in samples if s.endswith("_total")}
    assert table == (families - {f[: -len("_total")] for f in counters}) | counters
    assert metrics_in(doc) - {"cclctl_collective_duration_seconds_bucket"} <= table


def test_dashboard_is_valid_and_queries_only_exposed_metrics(make_tel):
    _, samples = exposed(make_tel)
    dash = json.loads((ROOT / "dashboards" / "cclctl-grafana.json").read_text())
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    used = {m for e in exprs for m in metrics_in(e)}
    assert used <= samples, used - samples
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
