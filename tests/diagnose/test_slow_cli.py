"""`cclctl diagnose slow` run as a subprocess: dumps in a folder, a live job in a real store,
the three exits (3 a finding, 0 healthy or not judged, 2 bad input) and the JSON document."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from slow_factory import Job, documents

from cclctl.store.client import StoreClient, StoreServer

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_FAULT = 0, 1, 2, 3
TWO_HOSTS = ("h1", "h1", "h2", "h2")


def slow(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "cclctl", "diagnose", "slow", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def write(directory: Path, job: Job) -> Path:
    for snap in documents(job):
        (directory / f"cclctl-{snap.job}-rank{snap.rank}.json").write_text(snap.to_json())
    return directory


@pytest.mark.timeout(60)
def test_a_straggler_in_dumps_exits_3_with_the_verdict_first(tmp_path: Path) -> None:
    out = slow(str(write(tmp_path, Job(slow={3}))))
    assert out.returncode == EXIT_FAULT, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("job j · dumps of 4 ranks · SLOW: rank 3 is a straggler: it enters")
    assert any(line.startswith("1. SLOW RANK  rank 3 is a straggler") for line in lines)
    assert any(
        re.match(r"   - entered last in 100% of the \d+ sampled calls", line) for line in lines
    )
    assert any(line.startswith("   next: look at what rank 3 (pid 1003, on h0)") for line in lines)
    rows = {line.split()[0]: line.split()[1:] for line in lines if line.strip()[:1].isdigit()}
    assert rows["3"][0].startswith("+") and rows["0"][0] != rows["3"][0]
    assert out.stderr.startswith("cclctl: error: slow: rank 3 is a straggler")


@pytest.mark.timeout(60)
def test_the_json_document_names_the_link_and_its_direction(tmp_path: Path) -> None:
    job = Job(hosts=TWO_HOSTS, slow_links={(1, 2)}, coupling=0.3)
    out = slow(str(write(tmp_path, job)), "--json")
    assert out.returncode == EXIT_FAULT, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["schema"], doc["version"], doc["source"]) == ("cclctl.slow", 1, "dumps")
    (finding,) = doc["findings"]
    assert (finding["kind"], finding["link"], finding["ranks"]) == ("slow_link", [1, 2], [1, 2])
    assert finding["slowdown"] >= 1.15 and finding["evidence"]
    assert doc["options"]["ongoing"] is False  # post-mortem: any confirmed run counts


@pytest.mark.timeout(60)
def test_a_healthy_job_exits_0_and_says_why(tmp_path: Path) -> None:
    out = slow(str(write(tmp_path, Job(jitter_s=0.01))))
    assert out.returncode == EXIT_OK, out.stderr
    assert out.stdout.splitlines()[0].startswith("job j · dumps of 4 ranks · not slow: 4 windows")


@pytest.mark.timeout(60)
def test_a_young_job_exits_0_with_the_reason(tmp_path: Path) -> None:
    out = slow(str(write(tmp_path, Job(windows=1, slow={2}))))
    assert out.returncode == EXIT_OK, out.stderr
    assert "not judged: too young to judge: 1 window of 5s complete" in out.stdout


@pytest.mark.timeout(60)
def test_a_stricter_minimum_is_a_flag(tmp_path: Path) -> None:
    write(tmp_path, Job(slow={3}))
    assert slow(str(tmp_path), "--min-slowdown", "2").returncode == EXIT_OK
    assert slow(str(tmp_path), "--confirm", "5").returncode == EXIT_OK


@pytest.mark.timeout(60)
def test_a_small_straggler_held_long_is_named_unless_the_sustained_minimum_is_raised(
    tmp_path: Path,
) -> None:
    write(tmp_path, Job(slow={3}, lag_share=0.08, windows=6))  # 1.09x
    out = slow(str(tmp_path))
    assert out.returncode == EXIT_FAULT, out.stderr
    assert "under the 1.15x that 2 windows confirm" in out.stdout
    assert slow(str(tmp_path), "--sustained-slowdown", "1.15").returncode == EXIT_OK


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--min-slowdown", "0.9"), "--min-slowdown must be above 1"),
        (("--sustained-slowdown", "1"), "--sustained-slowdown must be above 1"),
        (("--confirm", "0"), "--confirm must be 1 to 12 windows"),
        (("--skew", "-1"), "--skew must be 0 to 60 seconds"),
        (("/no/such/dir",), "/no/such/dir: no such file or folder"),
        (("x.json", "--store", "h:1"), "give dump files or --store, not both"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], message: str):
    write(tmp_path, Job())
    out = slow(*args, *(() if "/" in args[0] or "--store" in args else (str(tmp_path),)))
    assert out.returncode == EXIT_USAGE, out.stderr
    assert message in out.stderr and len(out.stderr.splitlines()) == 1


@pytest.fixture
def store() -> Iterator[StoreClient]:
    with StoreServer() as srv, StoreClient(srv.host, srv.port, connect_timeout_s=5) as client:
        yield client


@pytest.mark.timeout(60)
def test_live_from_the_store(store: StoreClient) -> None:
    for snap in documents(Job(hosts=TWO_HOSTS, pattern="all", slow_egress="h2"), "status"):
        store.set(f"cclctl/j/status/{snap.rank}", snap.to_json().encode())
    out = slow("--store", store.address, "--json")
    assert out.returncode == EXIT_FAULT, out.stderr
    doc = json.loads(out.stdout)
    assert doc["source"] == "live" and doc["options"]["ongoing"] is True
    assert [(f["kind"], f["host"]) for f in doc["findings"]] == [("slow_host", "h2")]
