"""A probe's findings feed the rest, from records: the published document read back
(bounded, checked), the metrics of the rank that ran it, ``top``'s line in 80 columns and
``diagnose slow``'s evidence."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cclctl import probe_record
from cclctl.config import RuntimeConfig
from cclctl.diagnose import slow_probe
from cclctl.diagnose.slow_model import SLOW, SlowFinding, SlowOptions, SlowReport
from cclctl.errors import BadInput, UsageError
from cclctl.live import snapshot
from cclctl.live.probe_line import probe_line, unreadable_line
from cclctl.probe import document
from cclctl.probe.in_job import probe, publish
from cclctl.probe.model import OK, UNREACHABLE, Link, ProbeRun
from cclctl.probe.verdict import judge
from cclctl.telemetry.exporter import MetricsExporter
from cclctl.telemetry.exporter_probe import MAX_PROBE_SERIES
from cclctl.telemetry.hub import Telemetry

HOSTS = ("h0", "h1", "h2", "h3")
T0 = 1_700_000_000 * 10**9


def _doc(slow: dict[tuple[int, int], float] | None = None, cut: tuple[int, int] | None = None,
         hosts: tuple[str, ...] = HOSTS) -> dict[str, object]:  # fmt: skip
    """The cclctl.probe document of a probe over ``hosts`` (one rank each): 1 GB/s links
    but ``slow``'s, the pair ``cut`` unreachable."""
    n = len(hosts)
    links = []
    for s in range(n):
        for d in range(n):
            if s == d:
                continue
            gone = cut is not None and {s, d} == set(cut)
            bw = None if gone else (slow or {}).get((s, d), 1e9)
            links.append(Link(s, d, "tcp", UNREACHABLE if gone else OK, bw, 1e-5, 5,
                              "timed out" if gone else ""))  # fmt: skip
    run = ProbeRun(n, hosts, tuple(range(n)), "tcp", "all", "each", n - 1, (0.1,) * (n - 1),
                   tuple(links), time_ns=T0)  # fmt: skip
    return document.build(run, judge(run))


def _record(doc: dict[str, object]) -> probe_record.ProbeRecord:
    return probe_record.parse(json.dumps(probe_record.bounded(doc)))


def test_the_published_document_reads_back_with_its_flags_and_findings() -> None:
    rec = _record(_doc({(1, 2): 20e6}, cut=(0, 3)))
    assert rec.time_ns == T0 and rec.world_size == 4 and rec.links_total == 12
    assert {(x.src, x.dst) for x in rec.links if x.flagged} == {(1, 2)}
    assert {(x.src, x.dst) for x in rec.links if not x.passed} == {(1, 2), (0, 3), (3, 0)}
    assert [f.kind for f in rec.findings] == ["unreachable", "slow_link"]
    assert rec.medians["tcp"] == pytest.approx(1e9)


def test_a_large_probe_is_published_bounded_with_the_failing_links_kept() -> None:
    doc = _doc({(1, 2): 20e6})
    link = dict(doc["links"][0])  # type: ignore[index]
    doc["links"] = [dict(link, src=i % 100, dst=100 + i % 7, flagged=False)
                    for i in range(probe_record.MAX_LINKS + 10)]  # fmt: skip
    doc["links"].append(dict(link, src=5, dst=6, flagged=True))  # type: ignore[attr-defined]
    doc["world_size"] = 200
    rec = _record(doc)
    assert len(rec.links) == probe_record.MAX_LINKS
    assert rec.links_total == probe_record.MAX_LINKS + 11
    assert rec.link(5, 6) is not None and rec.link(5, 6).flagged  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "change, words",
    [
        ({"schema": "cclctl.dump"}, "not a cclctl.probe document"),
        ({"version": 9}, "newer than this cclctl reads"),
        ({"world_size": 2, "hosts": ["h0", "h1"]}, "beyond the world size 2"),
        ({"links": [{}] * (probe_record.MAX_LINKS + 1)}, "over the 4,096"),
        ({"links": "all"}, "must be lists"),
    ],
)
def test_a_document_a_reader_cannot_use_is_refused_in_one_line(
    change: dict[str, object], words: str
) -> None:
    doc = {**_doc(), **change}
    with pytest.raises(BadInput, match=words):
        probe_record.parse(json.dumps(doc))


def _scrape(tel: Telemetry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = MetricsExporter(tel.metrics_view).render().decode()
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k in ("src", "dst", "kind"))))
        : s.value
        for f in text_string_to_metric_families(text) if f.name.startswith("cclctl_probe")
        for s in f.samples
    }  # fmt: skip


def test_the_rank_that_ran_the_probe_serves_its_links_and_findings_as_metrics() -> None:
    tel = Telemetry(RuntimeConfig(job="j"), rank=0, world_size=4)
    try:
        assert _scrape(tel) == {}  # no probe yet: no series
        assert publish(tel, _doc({(1, 2): 20e6}, cut=(0, 3))) is False  # no store: metrics only
        got = _scrape(tel)
    finally:
        tel.close()
    link = (("dst", "2"), ("kind", "tcp"), ("src", "1"))
    assert got[("cclctl_probe_link_flagged", link)] == 1
    assert got[("cclctl_probe_link_bandwidth_bytes_per_second", link)] == 20e6
    assert got[("cclctl_probe_link_flagged", (("dst", "3"), ("kind", "tcp"), ("src", "0")))] == 1
    assert ("cclctl_probe_link_bandwidth_bytes_per_second",
            (("dst", "3"), ("kind", "tcp"), ("src", "0"))) not in got  # fmt: skip
    flagged = [k for k, v in got.items() if k[0] == "cclctl_probe_link_flagged" and v == 1]
    assert len(flagged) == 3
    assert sum(1 for k in got if k[0] == "cclctl_probe_link_flagged") == 12
    assert got[("cclctl_probe_links", ())] == 12
    assert got[("cclctl_probe_findings", (("kind", "unreachable"),))] == 1
    assert got[("cclctl_probe_findings", (("kind", "slow_host"),))] == 0
    assert got[("cclctl_probe_timestamp_seconds", ())] == T0 / 1e9


def test_the_metrics_hold_at_most_the_bound_of_links_the_failing_first() -> None:
    doc = _doc()
    link = dict(doc["links"][0])  # type: ignore[index]
    doc["links"] = [dict(link, src=i // 40, dst=40 + i % 40) for i in range(1600)]
    doc["links"][-1]["flagged"] = True  # type: ignore[index]
    doc["world_size"] = 80
    tel = Telemetry(RuntimeConfig(job="j"), rank=0, world_size=80)
    try:
        tel.set_probe(_record(doc))
        got = _scrape(tel)
    finally:
        tel.close()
    series = [k for k in got if k[0] == "cclctl_probe_link_flagged"]
    assert len(series) == MAX_PROBE_SERIES
    assert got[("cclctl_probe_link_flagged", (("dst", "79"), ("kind", "tcp"), ("src", "39")))] == 1
    assert got[("cclctl_probe_links", ())] == 1600


def test_top_says_in_one_line_of_80_columns_when_the_probe_ran_and_what_it_found() -> None:
    ok = _record(_doc())
    assert probe_line(ok, T0 + 12 * 10**9) == "probe 12s ago: 12 links ok"
    found = _record(_doc({(1, 2): 20e6}, cut=(0, 3)))
    assert probe_line(found, T0 + 125 * 10**9) == (
        "probe 2m05s ago: 0<->3 unreachable; 1->2 slow (h1->h2)"
    )
    host = _record(_doc({(3, d): 20e6 for d in range(3)}))
    assert probe_line(host, T0) == "probe 0s ago: host h3 egress slow"
    many = _record(_doc({(s, d): 20e6 for s in range(8) for d in range(8) if (s + d) % 3 == 0
                         and s != d}, hosts=tuple(f"h{i}" for i in range(8))))  # fmt: skip
    line = probe_line(many, T0)
    shown = line.count(" slow")
    assert len(line) <= 80 and line.endswith(f"; +{len(many.findings) - shown} more")


def _report(*findings: SlowFinding) -> SlowReport:
    return SlowReport("j", "live", SLOW, "judged", list(findings), 2, 5.0, 4, {}, SlowOptions())


def _link_finding(src: int, dst: int) -> SlowFinding:
    return SlowFinding("slow_link", f"link {src} -> {dst} slow", [src, dst], 1.4,
                       ["throughput 20 MB/s"], "check the link", 2, link=(src, dst))  # fmt: skip


def test_diagnose_slow_says_which_findings_the_probe_confirms_and_what_else_it_found() -> None:
    probe = _record(_doc({(1, 2): 20e6}, cut=(0, 3)))
    report, evidence = slow_probe.join(
        _report(_link_finding(1, 2), _link_finding(2, 1)), probe, T0 + 30 * 10**9
    )
    assert evidence is not None
    first, second = report.findings
    assert first.evidence[0] == "throughput 20 MB/s"
    assert first.evidence[-1].startswith("confirmed by the probe 30s ago: rank 1 -> rank 2 (h1")
    assert second.evidence[-1].startswith("not confirmed by the probe 30s ago: it measured 1 GB/s")
    assert (evidence.links, evidence.findings, evidence.confirmed) == (12, 2, 1)
    assert [(f.kind, f.src, f.dst) for f in evidence.unnamed] == [("unreachable", 0, 3)]
    assert evidence.to_dict()["unnamed"][0]["kind"] == "unreachable"
    assert slow_probe.join(_report(), None, T0) == (_report(), None)


def test_a_slow_host_the_probe_named_too_is_confirmed() -> None:
    probe = _record(_doc({(3, d): 20e6 for d in range(3)}))
    host = SlowFinding("slow_host", "host h3 slow", [3], 1.5, [], "check h3", 2, host="h3")
    report, evidence = slow_probe.join(_report(host), probe, T0)
    assert report.findings[0].evidence == [
        "confirmed by the probe 0s ago: " + probe.findings[0].text
    ]
    assert evidence is not None and evidence.unnamed == () and evidence.confirmed == 1


def test_a_probe_document_a_reader_cannot_use_leaves_the_statuses_alone() -> None:
    listing = {"cclctl/j/probe": b'{"schema": "cclctl.probe", "version": 1, "world_size": -1}'}
    statuses = snapshot.parse("j", "store:1", listing)
    assert statuses.probe is None and statuses.bad == {}
    assert statuses.probe_error == "probe: world size -1 is not a world size (1 or more)"
    assert unreadable_line(statuses.probe_error).startswith("probe: unreadable (probe: world")
    good = snapshot.parse("j", "store:1", {"cclctl/j/probe": json.dumps(_doc()).encode()})
    assert good.probe is not None and good.probe.links_total == 12


def test_the_in_job_call_wants_a_cclctl_communicator() -> None:
    with pytest.raises(UsageError, match=r"needs a communicator of cclctl\.init\(\)"):
        probe(object())
