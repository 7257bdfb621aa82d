"""A real Prometheus server scrapes a real 4-rank job; its query API must see what the job did."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from scripts import script

from cclctl.launch.launcher import LaunchResult, launch

WORKER = script("prom_worker.py")
JOB = "prom-e2e"
RANKS = 4
GATHER_BYTES = 5 * 1000 * 4 * RANKS  # 5 all_gathers of the full gathered buffer


def _prometheus() -> str:
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install Prometheus (apt-get install prometheus); see .ci/run")
        pytest.skip("the prometheus binary is not installed")
    return path


def _free_port_block(count: int) -> int:
    """A base port with ``count`` consecutive free ports after it."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports")


def _query(port: int, promql: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _until(what: str, fn: Callable[[], Any], timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except OSError as exc:  # Prometheus still starting
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last answer: {last!r}")


def _by_rank(result: list[dict[str, Any]]) -> dict[str, float]:
    return {series["metric"]["rank"]: float(series["value"][1]) for series in result}


@pytest.mark.timeout(180)
def test_prometheus_scrapes_exact_counters_and_live_busbw(tmp_path: Path) -> None:
    binary = _prometheus()
    base = _free_port_block(RANKS)
    prom_port = _free_port_block(1)
    targets = ", ".join(f"'127.0.0.1:{base + r}'" for r in range(RANKS))
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: cclctl\n    honor_labels: true\n"
        f"    static_configs:\n      - targets: [{targets}]\n"
    )
    release = tmp_path / "release"
    env = {
        **os.environ,
        "CCLCTL_JOB": JOB,
        "CCLCTL_METRICS_PORT": str(base),
        "RELEASE": str(release),
    }
    result: list[LaunchResult] = []
    lines: list[str] = []
    job = threading.Thread(
        target=lambda: result.append(
            launch(
                [sys.executable, WORKER],
                RANKS,
                env=env,
                timeout_s=150,
                output=lambda rank, stream, line: lines.append(f"[{rank}] {line}"),
            )
        ),
        daemon=True,
    )
    job.start()
    server = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        sel = f'job="{JOB}"'

        def all_ranks_gathered() -> dict[str, float] | None:
            found = _by_rank(
                _query(prom_port, f'cclctl_collective_bytes_total{{{sel},op="all_gather"}}')
            )
            return found if len(found) == RANKS else None

        gathered = _until("all_gather bytes from every rank", all_ranks_gathered)
        assert gathered == {str(r): GATHER_BYTES for r in range(RANKS)}
        calls = _by_rank(_query(prom_port, f'cclctl_collectives_total{{{sel},op="all_gather"}}'))
        assert calls == {str(r): 5.0 for r in range(RANKS)}
        per_call = _by_rank(
            _query(
                prom_port,
                f'cclctl_collective_bytes_total{{{sel},op="all_reduce"}} '
                f'/ cclctl_collectives_total{{{sel},op="all_reduce"}}',
            )
        )
        assert per_call == {str(r): float(1 << 20) for r in range(RANKS)}
        busbw = _until(
            "a positive live busbw",
            lambda: [
                s
                for s in _query(
                    prom_port,
                    f"sum(rate(cclctl_collective_bus_bytes_total{{{sel}}}[5s])) "
                    f"/ sum(rate(cclctl_collective_seconds_total{{{sel}}}[5s]))",
                )
                if float(s["value"][1]) > 0
            ],
        )
        assert float(busbw[0]["value"][1]) > 1e6  # bytes/s: a loopback job moves MB/s at least
        links = _query(prom_port, f"sum by (rank) (cclctl_link_sent_bytes_total{{{sel}}})")
        assert len(links) == RANKS and all(float(s["value"][1]) > 0 for s in links)
        seqs = _by_rank(_query(prom_port, f"cclctl_last_completed_seq{{{sel}}}"))
        assert len(seqs) == RANKS and min(seqs.values()) >= 7  # 5 gathers + 1 reduce + 1 bcast
    finally:
        release.touch()
        job.join(60)
        server.terminate()
        server.wait(10)
    assert result and result[0].returncode == 0, "\n".join(lines[-30:])
