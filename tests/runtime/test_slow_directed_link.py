"""One slow directed link across namespace hosts, judged live by `cclctl diagnose slow`;
htb with a u32 filter on the sending host's device slows the data packets to one
destination host and nothing else (``BridgedHosts.slow_link``):

- four hosts, one rank each, a ring all_reduce, h1 -> h2 slowed: every rank of the ring
  then waits alike on the one before it;
- two hosts, two ranks each, a hierarchical all_reduce whose leaders (ranks 0 and 2)
  exchange across, h0 -> h1 slowed: both leaders wait alike on each other;
- three hosts, all_to_all, h1's whole egress slowed with tbf: a `slow_host`.

Either way the link shows in the time its messages take from first byte to last at the
receiver, and the verdict is a `slow_link` with that direction, no rank, live and then
post-mortem from the documents the ranks leave as the job ends. The namespaces
(their qdiscs with them) and every rank are removed on the way out."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netns_job import NETNS_JOB_MARKS
from ports import free_port
from slow_hosts import BridgedHosts, SlowHostsJob

pytestmark = [*NETNS_JOB_MARKS, pytest.mark.timeout(240)]


@pytest.fixture
def four() -> Iterator[BridgedHosts]:
    net = BridgedHosts(4)
    try:
        yield net
    finally:
        net.close()


@pytest.fixture
def three() -> Iterator[BridgedHosts]:
    net = BridgedHosts(3)
    try:
        yield net
    finally:
        net.close()


@pytest.fixture
def two() -> Iterator[BridgedHosts]:
    net = BridgedHosts(2)
    try:
        yield net
    finally:
        net.close()


def _found(doc: dict[str, Any]) -> bool:
    return bool(doc["findings"])


def _judge(hosts: BridgedHosts, tmp: Path, per_host: int, **extra: str) -> dict[str, Any]:
    """The live verdict, once it finds something; then the job ends cleanly and the
    post-mortem verdict from the documents its ranks left must find the same."""
    env = {"COUNT": str(1 << 16), **extra}
    job = SlowHostsJob(hosts, tmp, free_port(), per_host=per_host, **env)
    try:
        live = job.verdict(_found)
        assert job.finish() == [0] * len(job.procs)
    finally:
        job.kill()
    after = _post_mortem(job.dumps, job.job)
    assert [(f["kind"], f.get("link"), f.get("host")) for f in after["findings"]] == [
        (f["kind"], f.get("link"), f.get("host")) for f in live["findings"]
    ], after
    return live


def _post_mortem(folder: Path, job: str) -> dict[str, Any]:
    """`cclctl diagnose slow DIR --job JOB --json`, as a user runs it after the job."""
    cmd = [sys.executable, "-m", "cclctl", "diagnose", "slow", str(folder), "--job", job, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, out.stdout + out.stderr  # 3: it found something
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def test_one_slow_direction_of_a_ring_is_a_slow_link_not_a_rank(
    four: BridgedHosts, tmp_path: Path
) -> None:
    four.slow_link("h1", "h2", "40mbit")
    doc = _judge(four, tmp_path, per_host=1)
    assert [(f["kind"], f["link"]) for f in doc["findings"]] == [("slow_link", [1, 2])], doc
    finding = doc["findings"][0]
    assert finding["ranks"] == [1, 2]
    assert "h1 -> h2, TCP across hosts" in finding["summary"]
    assert any("first byte to last" in line for line in finding["evidence"]), finding


def test_one_slow_direction_between_two_leaders_is_a_slow_link_with_it(
    two: BridgedHosts, tmp_path: Path
) -> None:
    two.slow_link("h0", "h1", "40mbit")
    doc = _judge(two, tmp_path, per_host=2)
    assert [(f["kind"], f["link"]) for f in doc["findings"]] == [("slow_link", [0, 2])], doc
    evidence = doc["findings"][0]["evidence"]
    assert any("reverse direction is normal" in line for line in evidence), evidence


def test_a_host_whose_whole_egress_is_slow_is_a_slow_host(
    three: BridgedHosts, tmp_path: Path
) -> None:
    """tbf on h1's device: everything it sends is slow, so every link out of it is; the
    verdict names the host (its egress), not its links one by one."""
    three.slow_host("h1", "8mbit")
    doc = _judge(three, tmp_path, per_host=1, OP="all_to_all", COUNT=str(3 << 14))
    assert [(f["kind"], f["host"]) for f in doc["findings"]] == [("slow_host", "h1")], doc
    assert "egress" in doc["findings"][0]["summary"]
