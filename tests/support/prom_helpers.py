"""A real Prometheus server for the end-to-end tests: its binary, its config, its HTTP API."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ports import free_port_block

SCRAPE_JOB = "cclctl"  # the scrape job's name: Prometheus puts it in every series' `job`


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install Prometheus (apt-get install prometheus); see .ci/run")
        pytest.skip("the prometheus binary is not installed")
    return path


def start_prometheus(tmp: Path, targets: list[int]) -> tuple[subprocess.Popen[bytes], int]:
    """Prometheus scraping ``targets`` (local ports) every second with the config users
    write: no ``honor_labels``, so a label that clashes with the target's would show.
    """
    port = free_port_block(1)
    listed = ", ".join(f"'127.0.0.1:{p}'" for p in targets)
    config = tmp / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: {SCRAPE_JOB}\n"
        f"    static_configs:\n      - targets: [{listed}]\n"
    )
    server = subprocess.Popen(
        [
            prometheus_binary(),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return server, port


def api(port: int, path: str, params: list[tuple[str, str]]) -> Any:
    """The ``data`` of one successful API call; a query Prometheus rejects fails here."""
    url = f"http://127.0.0.1:{port}/api/v1/{path}?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as exc:
        if exc.code in (400, 422):  # the expression does not parse, or cannot be evaluated
            raise AssertionError(f"{params}: {exc.read().decode()}") from None
        raise  # 503 while Prometheus starts: an OSError, which ``until`` retries
    assert body["status"] == "success", body
    return body["data"]


def query(port: int, promql: str, at: float | None = None) -> list[dict[str, Any]]:
    """An instant query, now or at Unix time ``at``."""
    params = [("query", promql)] + ([("time", repr(at))] if at is not None else [])
    data = api(port, "query", params)
    assert data["resultType"] in ("vector", "scalar"), data
    return list(data["result"]) if data["resultType"] == "vector" else [data["result"]]


def until(what: str, fn: Callable[[], Any], timeout_s: float = 60) -> Any:
    """Poll ``fn`` until it returns something true; fail (never hang) after ``timeout_s``."""
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


def by_rank(result: list[dict[str, Any]]) -> dict[str, float]:
    return {series["metric"]["rank"]: float(series["value"][1]) for series in result}


def until_equal(what: str, fn: Callable[[], Any], expected: Any, timeout_s: float = 60) -> None:
    """Poll ``fn`` until it returns ``expected`` (every rank caught up, not only the first)."""
    seen: list[Any] = []

    def equal() -> bool:
        seen[:] = [fn()]
        return bool(seen[0] == expected)

    try:
        until(what, equal, timeout_s)
    except AssertionError:
        raise AssertionError(f"timed out waiting for {what}: {seen} != {expected!r}") from None
