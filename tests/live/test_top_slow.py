"""`cclctl top` shows `diagnose slow`'s verdict: the slow rank or link in words above the
table, the suspects' rows first, and each rank's entry lag and wait share."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from rich.console import Console
from slow_factory import Job, documents, ending_now

from cclctl.commands.top_screen import render, screen_of
from cclctl.live import table
from cclctl.live.rank_view import Thresholds
from cclctl.live.slow_cells import add_slow_columns
from cclctl.live.snapshot import fetch
from cclctl.store.client import StoreClient, StoreServer


@pytest.fixture
def store() -> Iterator[StoreClient]:
    with StoreServer() as srv, StoreClient(srv.host, srv.port, connect_timeout_s=5) as client:
        yield client


def publish(client: StoreClient, job: Job) -> None:
    """Statuses of the job's ranks as they would publish them now."""
    for snap in documents(job, "status"):
        client.set(f"cclctl/j/status/{snap.rank}", snap.to_json().encode())


def top(client: StoreClient, *args: str) -> str:
    env = {**os.environ, "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "cclctl", "top", "--store", client.address, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.timeout(60)
def test_a_straggler_is_named_in_words_and_its_row_comes_first(store: StoreClient) -> None:
    publish(store, ending_now(slow={2}))
    lines = top(store, "--once").splitlines()
    verdict = [line for line in lines if line.startswith("slow: ")]
    assert verdict and verdict[0].startswith("slow: rank 2 is a straggler: it enters its")
    # the header stands by that verdict (it said "all look fine" right above it)
    assert " · 4/4 ranks · 1 slow · store " in lines[0], lines[0]
    head = next(i for i, line in enumerate(lines) if "entry lag" in line)
    assert "wait share" in lines[head]
    rows = [line for line in lines[head + 2 :] if line.strip()[:1].isdigit()]
    assert rows[0].split()[0] == "2"  # nothing hangs: the straggler's row first
    at = lines[head].index("entry lag")
    lag = {row.split()[0]: row[at:].split()[0] for row in rows}
    share = {row.split()[0]: int(row[at:].split()[1].rstrip("%")) for row in rows}
    assert lag["2"].startswith("+") and all(lag[r].startswith("-") for r in "013")
    assert min(share, key=share.__getitem__) == "2" and share["2"] < 15 < min(
        share["0"], share["1"]
    )


@pytest.mark.timeout(60)
def test_a_slow_link_in_words_and_the_json_document(store: StoreClient) -> None:
    publish(store, ending_now(hosts=("h1", "h1", "h2", "h2"), slow_links={(1, 2)}, coupling=0.3))
    text = top(store, "--once")
    assert "slow: link rank 1 -> rank 2 (h1 -> h2, TCP across hosts) is slow" in text
    doc = json.loads(top(store, "--json"))
    assert doc["slow"]["schema"] == "cclctl.slow"
    assert [f["link"] for f in doc["slow"]["findings"]] == [[1, 2]]


@pytest.mark.timeout(60)
def test_a_healthy_job_says_so_quietly(store: StoreClient) -> None:
    publish(store, ending_now())
    lines = top(store, "--once").splitlines()
    assert any(line.startswith("slow: not slow: 4 windows of 5s") for line in lines)
    assert " · 4/4 ranks · all look fine · store " in lines[0], lines[0]


@pytest.mark.timeout(60)
def test_at_80_columns_a_slow_jobs_columns_stay(store: StoreClient) -> None:
    """Drawn for a terminal 80 characters wide: host and pid go, the slow figures stay."""
    publish(store, ending_now(slow={1}))
    screen = screen_of(fetch(store, "j"), None, Thresholds())
    console = Console(width=80, record=True, force_terminal=False)
    console.print(render(screen, None, width=80))
    head = next(line for line in console.export_text().splitlines() if line.startswith("rank"))
    assert "entry lag" in head and "wait share" in head, head
    assert "host" not in head and "pid" not in head


@pytest.mark.timeout(60)
def test_beside_a_hangs_verdict_not_slow_is_left_unsaid(store: StoreClient) -> None:
    """A hung job is neither slow nor judged slow: its screen keeps the lines for the
    hang (the "not slow" or "not judged" line only ever says something beside no verdict)."""
    publish(store, ending_now())
    screen = screen_of(fetch(store, "j"), None, Thresholds())
    assert screen.slow is not None and not screen.slow.findings
    model = table.build_table(screen.view, screen.culprits)
    said = add_slow_columns(model, screen.slow).waiting
    assert said and said[-1].startswith("slow: not slow: "), said
    hung = dataclasses.replace(model, verdicts=[("NOT ENTERED", "rank 2 never entered ...")])
    shown = add_slow_columns(hung, screen.slow)
    assert not any(line.startswith("slow: ") for line in shown.waiting), shown.waiting
    assert shown.verdicts == hung.verdicts and "entry lag" in shown.columns
