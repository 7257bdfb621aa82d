"""The host agent's one Prometheus endpoint: a real job's four ranks under one target.

A launched job with ``CCLCTL_HOST_METRICS_PORT`` set: a real Prometheus scrapes the host's
agent alone and sees every rank's collectives grow, labelled by rank, and the agent's own
writes. The collector's families are also checked on statuses built here.
"""

from __future__ import annotations

import sys
from pathlib import Path

from live_job import live_job
from ports import free_port
from prom_helpers import by_rank, query, start_prometheus, until

from cclctl.telemetry.exporter_host import HostCollector

WORKER = str(Path(__file__).parents[1] / "support" / "host_agent_worker.py")


def _families(collector: HostCollector) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {
        family.name: [(sample.labels, sample.value) for sample in family.samples]
        for family in collector.collect()
    }


def test_the_collector_has_a_bounded_set_per_rank_and_skips_what_is_not_a_number() -> None:
    good = {"time_ns": 4_000_000_000, "counters": {"collectives": 7, "errors": 1,
            "last_busbw_gbps": {"all_reduce": 2.5, "broadcast": "fast"}},
            "comms": {"0:0-1": {"last_started": 9, "last_completed": 8}}}  # fmt: skip
    statuses = {0: good, 1: None, 2: {"counters": {"collectives": True}}}
    counts = {"writes": 3, "connected": 2}
    got = _families(HostCollector("j", "h1", lambda: statuses, lambda: counts, lambda: 5 * 10**9))
    rank0 = {"cclctl_job": "j", "host": "h1", "rank": "0"}
    assert got["cclctl_rank_collectives"] == [(rank0, 7.0)]  # rank 1: not a status; 2: a bool
    assert got["cclctl_rank_errors"] == [(rank0, 1.0)] and got["cclctl_rank_hangs"] == []
    assert got["cclctl_rank_last_busbw_gbps"] == [({**rank0, "op": "all_reduce"}, 2.5)]
    assert got["cclctl_rank_seq"] == [
        ({**rank0, "comm": "0:0-1", "state": "started"}, 9.0),
        ({**rank0, "comm": "0:0-1", "state": "completed"}, 8.0),
    ]
    assert got["cclctl_rank_status_age_seconds"] == [(rank0, 1.0)]
    assert got["cclctl_host_agent_writes"] == [({"cclctl_job": "j", "host": "h1"}, 3.0)]
    assert got["cclctl_host_agent_ranks"] == [({"cclctl_job": "j", "host": "h1"}, 2.0)]


def test_prometheus_scrapes_a_hosts_ranks_from_its_agent(tmp_path: Path) -> None:
    release, port = tmp_path / "release", free_port()
    env = {"CCLCTL_JOB": "host-metrics", "CCLCTL_STATUS_INTERVAL": "0.2", "RELEASE": str(release),
           "CCLCTL_HOST_METRICS_PORT": str(port)}  # fmt: skip
    with live_job([sys.executable, WORKER], 4, env, release):
        prom, prom_port = start_prometheus(tmp_path, [port])
        try:
            first = until(
                "every rank's collectives under the one target",
                lambda: (
                    len(r := by_rank(query(prom_port, "cclctl_rank_collectives_total"))) == 4 and r
                ),
            )
            assert set(first) == {"0", "1", "2", "3"}
            until(
                "the collectives growing on every rank",
                lambda: all(
                    v > first[k]
                    for k, v in by_rank(query(prom_port, "cclctl_rank_collectives_total")).items()
                ),
            )
            writes = query(prom_port, "cclctl_host_agent_writes_total")
            assert len(writes) == 1 and float(writes[0]["value"][1]) > 0
            targets = {s["metric"]["instance"] for s in query(prom_port, "up")}
            assert targets == {f"127.0.0.1:{port}"}  # one target for the host's four ranks
        finally:
            prom.terminate()
            prom.wait(30)
