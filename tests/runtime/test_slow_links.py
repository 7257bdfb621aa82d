"""A slow host across two network-namespace hosts (ranks 0-1 on h1, 2-3 on h2), slowed
with the system's own tools, judged live by `cclctl diagnose slow` run on h1: h2's whole
egress under tbf is a `slow_host`. The qdiscs are removed and every rank is killed on the
way out. (One slowed direction, and a host's egress judged post-mortem too, are in
test_slow_directed_link.py.)"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from netns_job import ADDRS, NETNS_JOB_MARKS, NetJob, TwoHosts, sh
from ports import free_port
from slow_job import WORKER

pytestmark = [*NETNS_JOB_MARKS, pytest.mark.timeout(240)]


def _start(hosts: TwoHosts, tmp: Path, **extra: str) -> NetJob:
    env = {"CCLCTL_SLOW_WINDOW": "2", "RELEASE": str(tmp / "release"), **extra}
    return NetJob(hosts, tmp, free_port(), timeout_s=30.0, worker=WORKER, extra=env)


def _verdict(
    job: NetJob, done: Callable[[dict[str, Any]], bool]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`cclctl diagnose slow --store --json` run on h1 until ``done`` holds for it: that
    verdict, and every finding seen before it."""
    deadline = time.monotonic() + 150
    seen: list[Any] = []
    while time.monotonic() < deadline:
        out = job.cclctl("h1", "diagnose", "slow", "--store", job.store, "--json")
        if out.returncode in (0, 3):
            seen.append(json.loads(out.stdout))
            if done(seen[-1]):
                return seen[-1], [f for doc in seen[:-1] for f in doc["findings"]]
        time.sleep(0.5)
    raise AssertionError(f"no verdict as wanted; the last: {seen[-1:]!r}")


def _a_slow_host(doc: dict[str, Any]) -> bool:
    return any(f["kind"] == "slow_host" for f in doc["findings"])


def _blames_h2(finding: dict[str, Any]) -> bool:
    """A finding on h2's egress: the host, or a link out of it (ranks 2-3 are on h2)."""
    if finding["kind"] == "slow_link":
        return finding["link"][0] in (2, 3) and finding["link"][1] in (0, 1)
    return finding["kind"] == "slow_host" and finding["host"] == "h2"


def _egress_limit(hosts: TwoHosts, host: str) -> None:
    """tbf on ``host``'s veth end: all it sends at 8 Mbit/s."""
    dev = hosts.devs[list(ADDRS).index(host)]
    sh("ip", "netns", "exec", hosts.ns[host], "tc", "qdisc", "add", "dev", dev, "root", "tbf",
       "rate", "8mbit", "burst", "32kbit", "latency", "400ms")  # fmt: skip


def _clear(hosts: TwoHosts) -> None:
    for host, dev in zip(ADDRS, hosts.devs, strict=True):
        sh("ip", "netns", "exec", hosts.ns[host], "tc", "qdisc", "del", "dev", dev, "root",
           check=False)  # fmt: skip


def test_a_host_whose_egress_is_slow_is_a_slow_host(hosts: TwoHosts, tmp_path: Path) -> None:
    _egress_limit(hosts, "h2")
    job = _start(hosts, tmp_path, OP="all_to_all", COUNT=str(1 << 16))
    try:
        doc, before = _verdict(job, _a_slow_host)
    finally:
        (tmp_path / "release").touch()
        job.kill_ranks()
        hosts.kill_all()
        _clear(hosts)
    assert [(f["kind"], f["host"]) for f in doc["findings"]] == [("slow_host", "h2")], doc
    assert "egress" in doc["findings"][0]["summary"]
    # before the host's every link was judged slow in a row, a link of it may have been:
    # never anything that is not h2's egress
    assert all(_blames_h2(f) for f in before), before
