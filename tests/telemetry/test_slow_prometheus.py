"""docs/metrics.md's "which rank is slow" and "which link is slow" queries, and the
dashboard's panels for them, against a real Prometheus scraping a real job whose rank 2
computes twice as long per step: the queries name rank 2, where the per-rank bus bandwidth the
docs once suggested points at the others."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from live_job import live_job
from ports import free_port_block
from prom_helpers import query, start_prometheus, until
from promql_sources import dashboard_queries, doc_queries, grafana
from slow_job import WORKER, worker_env

pytestmark = pytest.mark.slow  # a real job scraped by a real Prometheus
RANKS, SLOW = 4, "2"
#: Scrapes (one a second) of every rank held before the minute-long rates are read.
SCRAPES = 20
SCRAPED = "cclctl_collective_seconds_total"


def _one(marker: str, queries: list[str]) -> str:
    (found,) = [q for q in queries if marker in q]
    return found


@pytest.mark.timeout(180)
def test_the_slow_rank_and_link_queries_name_the_straggler(tmp_path: Path) -> None:
    docs = doc_queries()
    waited_for = _one('phase="entry"', docs)
    waits_least = _one("bottomk(1, sum by (cclctl_job, rank) (rate(cclctl_collective_seconds", docs)
    slow_link = _one('phase="data"', docs)
    panel = _one('phase="entry"', dashboard_queries())
    link_panel = _one('phase="data"', dashboard_queries())
    job = f"promslow-{uuid.uuid4().hex[:6]}"
    base = free_port_block(RANKS)
    # Rank 2 computes twice as long a step: what this test checks is that the documented
    # queries name a straggler (how small a one the analysis finds is the benchmark's
    # business), on a machine whose load makes every rank straggle now and then.
    env = worker_env(
        tmp_path, CCLCTL_JOB=job, SLOW_RANKS=SLOW, SLOW_EXTRA="1.0", CCLCTL_METRICS_PORT=str(base)
    )
    server: subprocess.Popen[bytes] | None = None
    try:
        with live_job([sys.executable, WORKER], RANKS, env, tmp_path / "release"):
            server, prom = start_prometheus(tmp_path, list(range(base, base + RANKS)))

            def ranked() -> list[tuple[str, float]] | None:
                # The queries' rates are over a minute: judge on SCRAPES of every rank, not on
                # the first two, which a loaded machine's scheduling can turn either way.
                held = query(prom, f"min(count_over_time({SCRAPED}[1m]))")
                if not held or float(held[0]["value"][1]) < SCRAPES:
                    return None
                found = query(prom, waited_for)
                if len(found) < RANKS - 1:
                    return None  # not every rank waited on yet
                return sorted(((s["metric"]["peer"], float(s["value"][1])) for s in found),
                              key=lambda pv: -pv[1])  # fmt: skip

            order = until("entry waits of every rank", ranked, timeout_s=120)
            assert order[0][0] == SLOW and order[0][1] > 2.0, order
            (least,) = query(prom, waits_least)
            assert least["metric"]["rank"] == SLOW
            links = query(prom, slow_link)
            assert links and all({"rank", "peer"} <= set(s["metric"]) for s in links)
            values = {"job": job, "__rate_interval": "1m", "comm": ".*", "op": ".*"}
            top = max(query(prom, grafana(panel, values)), key=lambda s: float(s["value"][1]))
            assert top["metric"]["peer"] == SLOW
            assert query(prom, grafana(link_panel, values))
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
