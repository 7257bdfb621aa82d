"""Hosts in network namespaces on one bridge, one rank of `cclctl probe` on each.

Each host is a namespace with a hostname of its own (``unshare --uts``) and a veth into a
switch namespace holding the bridge, so any two hosts talk over their own path and a fault
set on one host's device (``tc``, ``iptables``) touches exactly the links it should. Rank 0
hosts the job's store on h0 (env-launched, as srun starts ranks). ``close`` kills what runs
in the namespaces and deletes them (their devices, qdiscs and rules go with them).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from netns_job import TOKEN, sh

DEV = "eth0"


class BridgedHosts:
    """``n`` hosts h0..h(n-1) at 10.78.0.(1+i), named after the test process."""

    def __init__(self, n: int) -> None:
        tag = str(os.getpid())
        self.names = [f"h{i}" for i in range(n)]
        self.addr = {h: f"10.78.0.{i + 1}" for i, h in enumerate(self.names)}
        self.ns = {h: f"pb{h}-{tag}" for h in self.names}
        self.switch = f"pbsw-{tag}"
        self.busy: list[subprocess.Popen[bytes]] = []
        try:
            sh("ip", "netns", "add", self.switch)
            sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", self.switch, "link", "set", "br0", "up")
            for i, host in enumerate(self.names):
                ns, port = self.ns[host], f"p{i}"
                sh("ip", "netns", "add", ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
                sh("ip", "-n", ns, "link", "add", DEV, "type", "veth", "peer", "name", port,
                   "netns", self.switch)  # fmt: skip
                sh("ip", "-n", ns, "addr", "add", f"{self.addr[host]}/24", "dev", DEV)
                sh("ip", "-n", ns, "link", "set", DEV, "up")
                sh("ip", "-n", self.switch, "link", "set", port, "master", "br0")
                sh("ip", "-n", self.switch, "link", "set", port, "up")
        except BaseException:
            self.close()
            raise

    def run(self, host: str, *cmd: str) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", self.ns[host], *cmd)

    def slow_link(self, src: str, dst: str, rate: str) -> None:
        """htb on ``src``'s device: data packets to ``dst`` at ``rate``; small packets (its
        acknowledgements of what ``dst`` sends) and every other destination at full speed."""
        self.run(src, "tc", "qdisc", "add", "dev", DEV, "root", "handle", "1:", "htb",
                 "default", "10")  # fmt: skip
        for cls, speed in (("1:10", "20gbit"), ("1:20", rate)):
            self.run(src, "tc", "class", "add", "dev", DEV, "parent", "1:", "classid", cls,
                     "htb", "rate", speed, "ceil", speed)  # fmt: skip
        to = ("protocol", "ip", "u32", "match", "ip", "dst", f"{self.addr[dst]}/32")
        small = ("match", "u16", "0x0000", "0xff80", "at", "2")  # IP total length < 128
        base = ("tc", "filter", "add", "dev", DEV, "parent", "1:")
        self.run(src, *base, "prio", "1", *to, *small, "flowid", "1:10")
        self.run(src, *base, "prio", "2", *to, "flowid", "1:20")

    def slow_host(self, host: str, rate: str) -> None:
        """tbf on ``host``'s device: everything it sends at ``rate``."""
        self.run(host, "tc", "qdisc", "add", "dev", DEV, "root", "tbf", "rate", rate,
                 "burst", "32kbit", "latency", "100ms")  # fmt: skip

    def cut(self, a: str, b: str) -> None:
        """iptables DROP of everything between ``a`` and ``b``, both ways, on ``a``."""
        self.run(a, "iptables", "-A", "OUTPUT", "-d", self.addr[b], "-j", "DROP")
        self.run(a, "iptables", "-A", "INPUT", "-s", self.addr[b], "-j", "DROP")

    def load_cpus(self, n: int) -> None:
        """``n`` busy loops (ended by ``close``)."""
        for _ in range(n):
            self.busy.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))

    def probe(
        self, tmp: Path, port: int, *args: str, per_host: int = 1, timeout_s: float = 100
    ) -> ProbeResult:
        """``per_host`` ranks on each host run ``cclctl probe ARGS -J -`` (ranks numbered
        host by host); rank 0's exit and document."""
        cmd = [sys.executable, "-m", "cclctl", "probe", *args, "-J", "-"]
        procs = self.start(tmp, port, cmd, per_host=per_host)
        try:
            outs = [p.communicate(timeout=timeout_s) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(10)
        out, err = outs[0]
        assert out.strip(), f"rank 0 wrote no document (exit {procs[0].returncode}): {err}"
        return ProbeResult(procs[0].returncode, json.loads(out), err)

    def start(
        self, tmp: Path, port: int, cmd: list[str], per_host: int = 1, **extra: str
    ) -> list[subprocess.Popen[str]]:
        """``per_host`` ranks of ``cmd`` on each host (numbered host by host; rank 0 on h0
        hosts the job's store, job ``probe``), each with a TMPDIR of its host and ``extra``
        in its environment; stdout and stderr are pipes."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
        procs = []
        world = len(self.names) * per_host
        for rank in range(world):
            host = self.names[rank // per_host]
            folder = tmp / host
            folder.mkdir(exist_ok=True)
            env = {
                **base, "TMPDIR": str(folder), "RANK": str(rank), "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(rank % per_host), "LOCAL_WORLD_SIZE": str(per_host),
                "MASTER_ADDR": self.addr["h0"], "MASTER_PORT": str(port), "CCLCTL_JOB": "probe",
                "CCLCTL_TOKEN": TOKEN, "CCLCTL_STORE_LINGER": "1", "CCLCTL_TIMEOUT": "60",
                **extra,
            }  # fmt: skip
            inside = ["ip", "netns", "exec", self.ns[host], "unshare", "--uts", "sh", "-c",
                      f'hostname {host} && exec "$0" "$@"', *cmd]  # fmt: skip
            procs.append(subprocess.Popen(inside, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True,
                                          start_new_session=True))  # fmt: skip
        return procs

    def cclctl(self, host: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``cclctl ARGS`` run on ``host`` with the job's token."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
        env["CCLCTL_TOKEN"] = TOKEN
        cmd = ["ip", "netns", "exec", self.ns[host], sys.executable, "-m", "cclctl", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)

    def close(self) -> None:
        for proc in self.busy:
            proc.kill()
            proc.wait(10)
        deadline = time.monotonic() + 10
        for ns in self.ns.values():
            while time.monotonic() < deadline:
                pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.05)
        for ns in [*self.ns.values(), self.switch]:
            sh("ip", "netns", "del", ns, check=False)


class ProbeResult:
    def __init__(self, code: int, doc: dict[str, Any], stderr: str) -> None:
        self.code, self.doc, self.stderr = code, doc, stderr

    def flagged(self) -> set[tuple[int, int]]:
        return {(x["src"], x["dst"]) for x in self.doc["links"] if x["flagged"]}

    def findings(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.doc["findings"] if f["kind"] == kind]
