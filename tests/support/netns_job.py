"""A 4-rank fault job across two "hosts": network namespaces joined by a veth pair.

Ranks 0-1 run in namespace h1 (hostname h1, a UTS namespace of their own), ranks 2-3 in h2,
so ranks of one host share memory and the hosts talk TCP (the hybrid transport). Rank 0
hosts the job's store (env-launched, as srun or mpirun start ranks) at h1's address; each
host has a TMPDIR of its own, so each keeps its own dump folder. Every rank runs
``fault_worker.py`` and exits after its first error. ``close`` removes everything: the
processes in the namespaces (the lingering store included), the iptables rules (they die
with their namespace), the namespaces and the veth pair.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_job import error_lines

from cclctl.config import job_dir

WORKER = str(Path(__file__).with_name("fault_worker.py"))
TOKEN = "netns-job-token-0123456789abcdefghijklmn"
ADDRS = {"h1": "10.77.1.1", "h2": "10.77.1.2"}
HOST_OF = {0: "h1", 1: "h1", 2: "h2", 3: "h2"}
JOB = "netjob"

#: What these jobs need: root, and the system's own tools for namespaces and faults.
TOOLS = ("ip", "unshare", "ss", "iptables")
#: Marks a test of these jobs: skipped where the namespaces cannot be made.
NEEDS_NAMESPACES = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in TOOLS),
    reason=f"needs root and {', '.join(TOOLS)} for network namespaces",
)
#: The marks of a test module of these jobs: real jobs across network namespaces.
NETNS_JOB_MARKS = [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(120), NEEDS_NAMESPACES]


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=20)


class TwoHosts:
    """Two namespaces named after the test process, linked by a veth pair."""

    def __init__(self) -> None:
        tag = str(os.getpid())
        self.ns = {h: f"rv{h}-{tag}" for h in ADDRS}
        self.devs = (f"rva{tag}", f"rvb{tag}")
        try:
            for ns in self.ns.values():
                sh("ip", "netns", "add", ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "link", "add", self.devs[0], "type", "veth", "peer", "name", self.devs[1])
            for (host, ns), dev in zip(self.ns.items(), self.devs, strict=True):
                sh("ip", "link", "set", dev, "netns", ns)
                sh("ip", "-n", ns, "addr", "add", f"{ADDRS[host]}/24", "dev", dev)
                sh("ip", "-n", ns, "link", "set", dev, "up")
        except BaseException:
            self.close()
            raise

    def exec(self, host: str, *cmd: str) -> list[str]:
        """``cmd`` run inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self.ns[host], *cmd]

    def pids(self, host: str) -> list[int]:
        out = sh("ip", "netns", "pids", self.ns[host], check=False).stdout
        return [int(p) for p in out.split()]

    def kill_all(self) -> None:
        """SIGKILL every process in the namespaces (ranks, lingering stores: all started
        here), and wait until none is left."""
        deadline = time.monotonic() + 10
        while any(self.pids(h) for h in self.ns) and time.monotonic() < deadline:
            for host in self.ns:
                for pid in self.pids(host):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def close(self) -> None:
        """Kill what still runs in the namespaces, then delete them (their veth ends and
        iptables rules go with them)."""
        self.kill_all()
        for ns in self.ns.values():
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", self.devs[0], check=False)  # only if a namespace never got it


class NetJob:
    """The job: 4 ranks on ``hosts``, ``fault`` in CCLCTL_FAULT, ``timeout_s`` the watchdog."""

    def __init__(
        self,
        hosts: TwoHosts,
        tmp: Path,
        port: int,
        *,
        fault: str = "",
        timeout_s: float = 3.0,
        iters: int = 8,
        linger_s: float = 60.0,
        status_interval_s: float = 0.2,
        worker: str = WORKER,
        extra: dict[str, str] | None = None,
    ) -> None:
        """``worker``: the script every rank runs (its stdout piped when it is not
        ``fault_worker.py``); ``extra``: more environment (retry is off unless it says)."""
        self.hosts, self.port, self.n = hosts, port, 4
        self.tmp = {h: tmp / h for h in ADDRS}
        for folder in self.tmp.values():
            folder.mkdir()
        base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank in range(self.n):
            host = HOST_OF[rank]
            env = {
                **base,
                "TMPDIR": str(self.tmp[host]),
                "RANK": str(rank),
                "WORLD_SIZE": str(self.n),
                "LOCAL_RANK": str(rank % 2),
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": ADDRS["h1"],
                "MASTER_PORT": str(port),
                "CCLCTL_JOB": JOB,
                "CCLCTL_TOKEN": TOKEN,
                "CCLCTL_TIMEOUT": str(timeout_s),
                "CCLCTL_STATUS_INTERVAL": str(status_interval_s),
                "CCLCTL_STORE_LINGER": str(linger_s),
                "CCLCTL_FAULT": fault,
                "ITERS": str(iters),
                "PAUSE": "0.2",
                "HOLD_ON_ERROR": "0",
                "CCLCTL_RETRY_BUDGET": "0",  # these jobs show how a failure is raised
                **(extra or {}),
            }
            cmd = hosts.exec(
                host, "unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$0" "$@"'
            )
            self.procs.append(
                subprocess.Popen(
                    [*cmd, sys.executable, worker],
                    env=env,
                    stdout=subprocess.DEVNULL if worker == WORKER else subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            )

    @property
    def store(self) -> str:
        return f"{ADDRS['h1']}:{self.port}"

    def dump_dirs(self) -> list[str]:
        """Each host's default dump folder for the job."""
        return [job_dir(JOB, {"TMPDIR": str(t)}) for t in self.tmp.values()]

    def errors(self, ranks: list[int], timeout_s: float = 60.0) -> dict[int, str]:
        """Each of ``ranks``' error line, once it has exited."""
        return error_lines(dict(enumerate(self.procs)), ranks, timeout_s)

    def cclctl(self, host: str, *args: str) -> subprocess.CompletedProcess[str]:
        """The CLI run on ``host`` as its user runs it there (the job's token set)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
        return subprocess.run(
            self.hosts.exec(host, sys.executable, "-m", "cclctl", *args),
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "CCLCTL_TOKEN": TOKEN, "TMPDIR": str(self.tmp[host])},
        )

    def rank_pid(self, rank: int) -> int:
        """The rank's Python process (ip netns exec, unshare and sh exec into it)."""
        return self.procs[rank].pid

    def kill_ranks(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait(10)
