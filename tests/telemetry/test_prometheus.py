"""A real Prometheus server scrapes real jobs with the config users write; its query API
must see what the jobs did, and every query the docs and the dashboard ship must answer.

Two jobs run side by side: a healthy 4-rank job (known collectives, then load) and a hung
3-rank job whose last rank never enters a collective. A third target has nothing behind it.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ports import free_port_block
from prom_helpers import (
    SCRAPE_JOB,
    api,
    by_rank,
    query,
    start_prometheus,
    until,
    until_equal,
)
from promql_sources import dashboard_queries, dashboard_variables, doc_queries, grafana

from cclctl.launch.launcher import LaunchResult, launch
from scripts import script

pytestmark = pytest.mark.slow  # real jobs scraped by a real Prometheus
JOB, HUNG = "prom-e2e", "prom-hang"
RANKS, HUNG_RANKS = 4, 3
GATHER_BYTES = 5 * 1000 * 4 * RANKS  # 5 all_gathers of the full gathered buffer
HUNG_TIMEOUT_S = "10"  # the hung job's watchdog: long enough to see the call in flight


@dataclasses.dataclass
class Jobs:
    """The running scenario: Prometheus' port, the signal files and the dead target."""

    prom: int
    go: Path
    release: Path
    dead_target: str


def _start_job(
    worker: str, ranks: int, env: dict[str, str], out: list[LaunchResult], lines: list[str]
) -> threading.Thread:
    thread = threading.Thread(
        target=lambda: out.append(
            launch(
                [sys.executable, script(worker)],
                ranks,
                env={**os.environ, **env},
                timeout_s=150,
                output=lambda rank, stream, line: lines.append(
                    f"[{env['CCLCTL_JOB']} {rank}] {line}"
                ),
            )
        ),
        daemon=True,
    )
    thread.start()
    return thread


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    tmp = tmp_path_factory.mktemp("prom")
    base = free_port_block(RANKS + HUNG_RANKS + 1)
    go, release = tmp / "go", tmp / "release"
    results: list[LaunchResult] = []
    lines: list[str] = []
    common = {"RELEASE": str(release), "CCLCTL_TRACE_DIR": str(tmp)}
    threads = [
        _start_job(
            "prom_worker.py",
            RANKS,
            {**common, "CCLCTL_JOB": JOB, "CCLCTL_METRICS_PORT": str(base)},
            results,
            lines,
        ),
        _start_job(
            "prom_hang_worker.py",
            HUNG_RANKS,
            {
                **common,
                "CCLCTL_JOB": HUNG,
                "CCLCTL_METRICS_PORT": str(base + RANKS),
                "CCLCTL_TIMEOUT": HUNG_TIMEOUT_S,
                "GO": str(go),
            },
            results,
            lines,
        ),
    ]
    dead = base + RANKS + HUNG_RANKS  # a target nothing listens on: a rank that is gone
    server: subprocess.Popen[bytes] | None = None
    try:
        server, port = start_prometheus(tmp, list(range(base, dead + 1)))
        yield Jobs(port, go, release, f"127.0.0.1:{dead}")
    finally:
        go.touch()
        release.touch()
        for thread in threads:
            thread.join(60)
        if server is not None:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)
    assert len(results) == 2 and all(r.returncode == 0 for r in results), "\n".join(lines[-40:])


@pytest.mark.timeout(180)
def test_prometheus_scrapes_exact_counters_and_live_busbw(jobs: Jobs) -> None:
    prom, sel = jobs.prom, f'cclctl_job="{JOB}"'

    def all_ranks_gathered() -> dict[str, float] | None:
        found = by_rank(query(prom, f'cclctl_collective_bytes_total{{{sel},op="all_gather"}}'))
        return found if len(found) == RANKS else None

    gathered = until("all_gather bytes from every rank", all_ranks_gathered)
    assert gathered == {str(r): GATHER_BYTES for r in range(RANKS)}
    calls = by_rank(query(prom, f'cclctl_collectives_total{{{sel},op="all_gather"}}'))
    assert calls == {str(r): 5.0 for r in range(RANKS)}
    per_call = by_rank(
        query(
            prom,
            f'cclctl_collective_bytes_total{{{sel},op="all_reduce"}} '
            f'/ cclctl_collectives_total{{{sel},op="all_reduce"}}',
        )
    )
    assert per_call == {str(r): float(1 << 20) for r in range(RANKS)}
    busbw = until(
        "a positive live busbw",
        lambda: [
            s
            for s in query(
                prom,
                f"sum(rate(cclctl_collective_bus_bytes_total{{{sel}}}[5s])) "
                f"/ sum(rate(cclctl_collective_seconds_total{{{sel}}}[5s]))",
            )
            if float(s["value"][1]) > 0
        ],
    )
    assert float(busbw[0]["value"][1]) > 1e6  # bytes/s: a loopback job moves MB/s at least
    links = query(prom, f"sum by (rank) (cclctl_link_sent_bytes_total{{{sel}}})")
    assert len(links) == RANKS and all(float(s["value"][1]) > 0 for s in links)
    seqs = by_rank(query(prom, f"cclctl_collective_last_completed_seq{{{sel}}}"))
    assert len(seqs) == RANKS and min(seqs.values()) >= 7  # 5 gathers + 1 reduce + 1 bcast


@pytest.mark.timeout(180)
def test_no_label_clashes_with_the_targets_labels(jobs: Jobs) -> None:
    """Under the default ``honor_labels: false`` every series keeps its own labels: none is
    renamed ``exported_*``, and ``job`` is the scrape job's.
    """
    prom = jobs.prom
    series = until(
        "every rank of both jobs",
        lambda: (
            (found := query(prom, '{__name__=~"cclctl_.+"}'))
            and len({(s["metric"]["cclctl_job"], s["metric"]["rank"]) for s in found})
            == RANKS + HUNG_RANKS
            and found
        ),
    )
    for s in series:
        labels: dict[str, Any] = s["metric"]
        assert labels["job"] == SCRAPE_JOB, labels
        assert not [name for name in labels if name.startswith("exported_")], labels
        assert labels["cclctl_job"] in (JOB, HUNG), labels


# The docs' queries with a job-specific answer; every other one must answer non-empty.
BEHIND = (
    "max by (cclctl_job, comm) (cclctl_collective_last_started_seq)"
    " - on (cclctl_job, comm) group_right cclctl_collective_last_started_seq > 0"
)
STUCK = "time() - (cclctl_collective_inflight_start_timestamp_seconds > 0) > 60"
SILENT = "time() - cclctl_status_heartbeat_timestamp_seconds > 10"
DOWN = f'up{{job="{SCRAPE_JOB}"}} == 0'
ERRORS = "sum by (cclctl_job, comm, op, reason) (increase(cclctl_collective_errors_total[10m])) > 0"
HANGS = "sum by (cclctl_job, rank) (increase(cclctl_collective_hangs_total[10m])) > 0"
TIMED_OUT = 'increase(cclctl_collective_errors_total{reason="timed_out"}[10m]) > 0'
#: Grafana's variables as the dashboard's defaults set them (All), at a 1 s scrape.
GRAFANA_ALL = {"job": ".*", "comm": ".*", "op": ".*", "__rate_interval": "5s"}


def _hung(result: list[dict[str, Any]], *labels: str) -> set[tuple[str, ...]]:
    """The hung job's series of ``result``, as tuples of ``labels``."""
    return {
        tuple(s["metric"][name] for name in labels)
        for s in result
        if s["metric"].get("cclctl_job") == HUNG
    }


def _hangs_cover_expiries(prom: int, waiting: set[tuple[str, ...]]) -> None:
    """The ranks the HANGS query names come to be every rank whose call timed out, and only
    waiting ranks (the revoked one counts its hang too if its own watchdog looked first)."""
    seen: dict[str, set[tuple[str, ...]]] = {}

    def covered() -> bool:
        seen["hung"] = _hung(query(prom, HANGS), "rank")
        seen["timed out"] = _hung(query(prom, TIMED_OUT), "rank")
        return bool(seen["timed out"]) and seen["timed out"] <= seen["hung"] <= waiting

    try:
        until("every expiry counted as a hang", covered)
    except AssertionError:
        raise AssertionError(f"hangs counted by rank {seen}, waiting ranks {waiting}") from None


def _later(prom: int, promql: str, seconds: float) -> list[dict[str, Any]]:
    """What ``promql`` answers ``seconds`` from now if nothing changes (the API's ``time``):
    a duration threshold tested without waiting it out.
    """
    return query(prom, promql, at=time.time() + seconds)


@pytest.mark.timeout(180)
def test_every_shipped_query_answers(jobs: Jobs) -> None:
    """The hang first (in flight, then timed out), then every query of the docs and the
    dashboard as they stand, each where it has an answer.
    """
    docs = doc_queries()
    assert {BEHIND, STUCK, SILENT, DOWN, ERRORS, HANGS} <= set(docs)
    stuck_panel = _hang_answers(jobs)
    prom = jobs.prom
    for expr in docs:
        if expr not in (STUCK, SILENT, DOWN):  # checked in _hang_answers, where they answer
            assert query(prom, expr), f"docs/metrics.md: no answer from {expr}"
    for expr in dashboard_queries():
        if expr != stuck_panel:  # nothing of the hung job is in flight any more
            assert query(prom, grafana(expr, GRAFANA_ALL)), f"dashboard: no answer from {expr}"
    values = {"job": [JOB, HUNG], "op": ["all_gather", "all_reduce", "broadcast"]}
    for name, selector, label in dashboard_variables():
        params = [("match[]", grafana(selector, GRAFANA_ALL))] if selector else []
        found = api(prom, f"label/{label}/values", params)
        assert set(values.get(name, found)) <= set(found) and found, (name, found)


def _hang_answers(jobs: Jobs) -> str:
    """Start the hang once Prometheus has scraped the hung job idle, and check what the
    queries about hangs answer while it is in flight and after it timed out; returns the
    dashboard's stuck-collective query.
    """
    prom = jobs.prom
    hung_seqs = f'cclctl_collective_last_started_seq{{cclctl_job="{HUNG}"}}'
    idle = {str(r): 0.0 for r in range(HUNG_RANKS)}  # scraped with the zero error series
    until_equal("every rank of the hung job", lambda: by_rank(query(prom, hung_seqs)), idle)
    until(
        "the healthy job under load", lambda: query(prom, "rate(cclctl_collectives_total[5s]) > 0")
    )
    jobs.go.touch()  # every rank but the last enters an all_reduce the last never joins
    waiting = {("0",), ("1",)}
    until_equal("the hung call in flight", lambda: _hung(_later(prom, STUCK, 61), "rank"), waiting)
    stuck_panel = next(e for e in dashboard_queries() if "inflight_start" in e)
    panel = query(prom, grafana(stuck_panel, {**GRAFANA_ALL, "job": HUNG}))
    assert _hung(panel, "rank") == waiting
    until_equal(  # the first error of its series: increase() sees it over the zero before;
        "the timed-out call counted",  # one rank's watchdog expires it, the other is revoked
        lambda: _hung(query(prom, ERRORS), "op", "reason"),
        {("all_reduce", "timed_out"), ("all_reduce", "aborted")},
    )
    _hangs_cover_expiries(prom, waiting)

    behind = query(prom, BEHIND)
    assert {
        (s["metric"]["rank"], s["value"][1]) for s in behind if s["metric"]["cclctl_job"] == HUNG
    } == {("2", "1")}
    completed = BEHIND.replace("last_started", "last_completed")
    assert not _hung(query(prom, completed), "rank")  # why BEHIND reads started seqs
    lag_panel = next(e for e in dashboard_queries() if "last_started_seq" in e)
    lag = query(prom, grafana(lag_panel, {**GRAFANA_ALL, "job": HUNG}))
    assert {(s["metric"]["rank"], s["value"][1]) for s in lag} == {
        ("0", "0"),
        ("1", "0"),
        ("2", "1"),
    }
    assert not _hung(query(prom, SILENT), "rank")  # every rank still publishes
    assert _hung(_later(prom, SILENT, 11), "rank") == {(str(r),) for r in range(HUNG_RANKS)}
    down = [jobs.dead_target]  # until: a slow scrape of a live rank reads as down once
    until_equal(
        "the dead target", lambda: [s["metric"]["instance"] for s in query(prom, DOWN)], down
    )
    return stuck_panel
