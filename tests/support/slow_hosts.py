"""A slow job's ranks on network-namespace hosts joined by a bridge (``BridgedHosts`` of
tests/probe/probe_hosts.py: a veth per host, so ``tc`` on one host's device slows exactly
the links it should), and `cclctl diagnose slow --store --json` run on a host until its
verdict is what a test waits for. Every rank runs ``slow_worker.py``; ranks are numbered
host by host. ``finish`` ends them cleanly (each leaves its last document in ``dumps``, for a
post-mortem), ``kill`` at once (SIGKILL to each rank's session)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from netns_job import TOKEN
from slow_job import WINDOW_S, WORKER

sys.path.insert(0, str(Path(__file__).parents[1] / "probe"))
from probe_hosts import BridgedHosts

__all__ = ["BridgedHosts", "SlowHostsJob"]


class SlowHostsJob:
    """``per_host`` ranks of the slow worker on each of ``hosts``; rank 0 (on the first
    host) hosts the job's store."""

    def __init__(self, hosts: BridgedHosts, tmp: Path, port: int, per_host: int = 1,
                 **extra: str) -> None:  # fmt: skip
        self.hosts, self.port, self.job = hosts, port, "slowhosts"
        self.release = tmp / "release"
        self.dumps = tmp / "dumps"  # every host's ranks write here (one file system)
        base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
        world = len(hosts.names) * per_host
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank in range(world):
            host = hosts.names[rank // per_host]
            folder = tmp / host
            folder.mkdir(exist_ok=True)
            env = {
                **base, "TMPDIR": str(folder), "RANK": str(rank), "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(rank % per_host), "LOCAL_WORLD_SIZE": str(per_host),
                "MASTER_ADDR": hosts.addr[hosts.names[0]], "MASTER_PORT": str(port),
                "CCLCTL_JOB": self.job, "CCLCTL_TOKEN": TOKEN, "CCLCTL_TIMEOUT": "60",
                "CCLCTL_STORE_LINGER": "5", "CCLCTL_STATUS_INTERVAL": "0.2",
                "CCLCTL_SLOW_WINDOW": WINDOW_S, "RELEASE": str(self.release),
                "CCLCTL_TRACE_DIR": str(self.dumps), **extra,
            }  # fmt: skip
            cmd = ["ip", "netns", "exec", hosts.ns[host], "unshare", "--uts", "sh", "-c",
                   f'hostname {host} && exec "$0" "$@"', sys.executable, WORKER]  # fmt: skip
            with open(tmp / f"rank{rank}.err", "wb") as err:  # the rank keeps its own copy
                self.procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                                   stderr=err, start_new_session=True))  # fmt: skip

    @property
    def store(self) -> str:
        return f"{self.hosts.addr[self.hosts.names[0]]}:{self.port}"

    def verdict(
        self, done: Callable[[dict[str, Any]], bool], timeout_s: float = 120
    ) -> dict[str, Any]:
        """`cclctl diagnose slow --store --json` run on the first host, until ``done``
        holds for its document (that one), or fail with the last one seen."""
        deadline = time.monotonic() + timeout_s
        env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
        env["CCLCTL_TOKEN"] = TOKEN
        seen: list[Any] = []
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["ip", "netns", "exec", self.hosts.ns[self.hosts.names[0]], sys.executable,
                 "-m", "cclctl", "diagnose", "slow", "--store", self.store, "--job", self.job,
                 "--json"],
                capture_output=True, text=True, timeout=60, env=env,
            )  # fmt: skip
            if out.returncode in (0, 3):
                seen.append(json.loads(out.stdout))
                if done(seen[-1]):
                    return seen[-1]
            dead = [p.returncode for p in self.procs if p.poll() is not None]
            if dead:
                raise AssertionError(f"ranks ended (exit {dead}) before the verdict came")
            time.sleep(0.5)
        raise AssertionError(f"no verdict as wanted in {timeout_s:g}s; the last: {seen[-1:]!r}")

    def finish(self, timeout_s: float = 90) -> list[int | None]:
        """Ask every rank to stop at the next step (the worker's release file); their exit
        codes once they have ended, or None for one still running at ``timeout_s``."""
        self.release.touch()
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(deadline - time.monotonic(), 0.1))
        return [proc.poll() for proc in self.procs]

    def kill(self) -> None:
        self.release.touch()
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait(10)
