"""`cclctl probe` across namespace hosts, one rank each, with real faults on real links:
a directed link slowed by htb and a u32 filter, a host's egress slowed by tbf, a pair cut by
iptables DROP, and healthy hosts under CPU load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from netns_job import NETNS_JOB_MARKS
from probe_hosts import BridgedHosts

pytestmark = NETNS_JOB_MARKS

ARGS = ("-e", "1M", "-T", "2")


@pytest.fixture
def hosts() -> Iterator[BridgedHosts]:
    net = BridgedHosts(4)
    try:
        yield net
    finally:
        net.close()


def test_healthy_hosts_under_cpu_load_flag_nothing(hosts: BridgedHosts, tmp_path: Path) -> None:
    hosts.load_cpus(2)
    result = hosts.probe(tmp_path, 29721, *ARGS)
    assert result.code == 0, result.stderr
    assert result.doc["ok"] is True and result.doc["findings"] == []
    assert len(result.doc["links"]) == 12 and result.doc["rounds"] == 3
    assert {x["kind"] for x in result.doc["links"]} == {"tcp"}


def test_exactly_the_slowed_directed_link_is_flagged(hosts: BridgedHosts, tmp_path: Path) -> None:
    hosts.slow_link("h1", "h2", "40mbit")
    result = hosts.probe(tmp_path, 29722, *ARGS)
    assert result.code == 3, result.stderr
    assert result.flagged() == {(1, 2)}
    [finding] = result.doc["findings"]
    assert finding["kind"] == "slow_link" and (finding["src"], finding["dst"]) == (1, 2)
    assert finding["text"].startswith("rank 1 -> rank 2 (h1 -> h2): ")
    assert finding["text"].endswith("; reverse direction normal")


def test_a_slowed_host_is_named_as_the_host(hosts: BridgedHosts, tmp_path: Path) -> None:
    hosts.slow_host("h3", "40mbit")
    result = hosts.probe(tmp_path, 29723, *ARGS)
    assert result.code == 3, result.stderr
    findings = result.doc["findings"]
    assert len(findings) == 1, [f["text"] for f in findings]
    [finding] = findings
    assert (finding["kind"], finding["host"], finding["direction"]) == ("slow_host", "h3", "egress")
    assert result.flagged() == {(3, 0), (3, 1), (3, 2)}


def test_a_cut_pair_is_unreachable_and_the_rest_is_measured(
    hosts: BridgedHosts, tmp_path: Path
) -> None:
    hosts.cut("h2", "h3")
    result = hosts.probe(tmp_path, 29724, *ARGS)
    assert result.code == 3, result.stderr
    [finding] = result.doc["findings"]
    assert finding["kind"] == "unreachable" and (finding["src"], finding["dst"]) == (2, 3)
    measured = {(x["src"], x["dst"]) for x in result.doc["links"] if x["status"] == "ok"}
    assert measured == {(s, d) for s in range(4) for d in range(4) if s != d} - {(2, 3), (3, 2)}


def test_eight_ranks_two_a_host_flag_the_slowed_host_to_host_link(
    hosts: BridgedHosts, tmp_path: Path
) -> None:
    """Ranks 2-3 on h1, 4-5 on h2: the htb class slows every link from h1 to h2, and only
    those; with --per-host the one rank per host sees the same link alone."""
    hosts.slow_link("h1", "h2", "40mbit")
    result = hosts.probe(tmp_path, 29725, *ARGS, per_host=2)
    assert result.code == 3, result.stderr
    assert len(result.doc["links"]) == 56 and result.doc["rounds"] == 7
    assert {x["kind"] for x in result.doc["links"]} == {"shm", "tcp"}
    assert result.flagged() == {(2, 4), (2, 5), (3, 4), (3, 5)}
    assert {f["kind"] for f in result.doc["findings"]} == {"slow_link"}
    hosts_only = hosts.probe(tmp_path, 29726, *ARGS, "--per-host", per_host=2)
    assert hosts_only.code == 3, hosts_only.stderr
    assert hosts_only.doc["participants"] == [0, 2, 4, 6] and hosts_only.flagged() == {(2, 4)}
