"""Two "hosts" in network namespaces joined by a veth link: the job spans a real network.

Each host gets its own network namespace and hostname (a UTS namespace), so ranks on the
same host talk through shared memory and ranks on different hosts through TCP over the veth
pair: the hierarchical path a multi-node job takes. Needs root and iproute2; skipped
elsewhere (CI runs as root).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts import script

pytestmark = [
    pytest.mark.slow,  # real jobs across network namespaces
    pytest.mark.netns,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None,
        reason="needs root, iproute2 and unshare for network namespaces",
    ),
]
HERE = Path(__file__).parent
ADDRS = {"h1": "10.77.0.1", "h2": "10.77.0.2"}


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def hosts() -> Iterator[dict[str, str]]:
    """Two namespaces named per test process, linked by a veth pair; removed afterwards."""
    tag = str(os.getpid())
    names = {h: f"cc{h}-{tag}" for h in ADDRS}
    try:
        for ns in names.values():
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", f"va{tag}", "type", "veth", "peer", "name", f"vb{tag}")
        for (host, ns), dev in zip(names.items(), (f"va{tag}", f"vb{tag}"), strict=True):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{ADDRS[host]}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        yield names
    finally:
        for ns in names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def _rank(
    ns: str, host: str, rank: int, world: int, port: int, script: Path
) -> subprocess.Popen[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")},
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank % 2),
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": ADDRS["h1"],
        "MASTER_PORT": str(port),
        "CCLCTL_JOB": "multihost",
        "CCLCTL_TOKEN": "multihost-token-0123456789abcdefghijk",  # across hosts: set on each
        "CCLCTL_TIMEOUT": "60",
        "CCLCTL_STORE_LINGER": "1",  # rank 0's store process: gone soon after the test
    }
    cmd = [
        "ip",
        "netns",
        "exec",
        ns,
        "unshare",
        "--uts",
        "sh",
        "-c",
        f'hostname {host} && exec "$0" "$@"',
        sys.executable,
        str(script),
    ]
    return subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _run_job(
    hosts: dict[str, str], script: Path, port: int, timeout_s: float
) -> list[tuple[str, str]]:
    """Ranks 0-1 on h1 and 2-3 on h2; every rank must exit 0. Returns (stdout, stderr)."""
    procs = [
        _rank(hosts["h1" if r < 2 else "h2"], "h1" if r < 2 else "h2", r, 4, port, script)
        for r in range(4)
    ]
    try:
        outs = [p.communicate(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait(5)
    for rank, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"rank {rank}: {err[-2000:]}"
    return outs


@pytest.mark.timeout(240)
def test_correctness_matrix_across_two_hosts(hosts: dict[str, str]) -> None:
    """Every collective, dtype and reduction, with ranks 0-1 on h1 and 2-3 on h2."""
    outs = _run_job(hosts, script("matrix_worker.py"), port=29611, timeout_s=200)
    for rank, (out, _) in enumerate(outs):
        report = json.loads(out.strip().splitlines()[-1])
        assert report["rank"] == rank and report["failures"] == [] and report["cases"] > 1000


@pytest.mark.timeout(120)
def test_all_reduce_is_hierarchical_across_hosts(hosts: dict[str, str]) -> None:
    """Inside a host ranks share memory; only one rank per host crosses the network."""
    outs = _run_job(hosts, script("multihost_probe.py"), port=29612, timeout_s=100)
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert [r["value"] for r in reports] == [4.0] * 4
    assert {r["transport"] for r in reports} == {"hybrid"}
    assert [r["tcp_peers"] for r in reports] == [[2], [], [0], []]
    assert [r["algos"] for r in reports] == [["hier_cma"]] * 4  # its host phases single-copy
