"""Spurious retries: a healthy job on a jittery, loaded network retries nothing (asserts nothing).

One job of 4 ranks on two network-namespace hosts (tests/support/netns_job.py, ranks 0-1 on
h1, 2-3 on h2, the hybrid transport, ``CCLCTL_RETRY_BUDGET=30``) runs in-place all_reduces
back to back (tests/support/retry_worker.py) for ``--seconds``, while both ends of the veth
delay every packet by 20 ms +- 10 ms (``tc netem``, which also reorders them), each end
drops ``--loss`` percent of the packets it receives (``iptables -m statistic``, which
works where the kernel has no netem) and ``--load`` busy processes compete for the CPUs.
Nothing breaks, so every retry (a ``rerun`` line: the links were renewed) is spurious: a
stall seen where there was none (a lost packet's retransmission backs off, so loss tests
the stall threshold harder than jitter does).

Printed: calls completed by every rank, how many were exact, retries and failures, and the
spread of call times. The goal from the fault-tolerance issue: 0 retries in 10 minutes.
Needs root.

    python benchmarks/spurious_retries.py [--seconds 600] [--load 2] [--count 262144] [--loss 1]
"""

from __future__ import annotations

import argparse
import hashlib
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
from netns_job import NetJob, TwoHosts, sh  # noqa: E402
from retry_worker import rank_input  # noqa: E402

WORKER = str(ROOT / "tests" / "support" / "retry_worker.py")
NETEM = ("delay", "20ms", "10ms")


def _exact(count: int) -> str:
    total = np.sum([rank_input(r, count).astype(np.float64) for r in range(4)], axis=0)
    return hashlib.sha256(total.astype(np.float32).tobytes()).hexdigest()


def _netem(hosts: TwoHosts) -> str:
    """Delay and jitter on both ends of the veth; what was applied, in words (a kernel
    without the netem qdisc runs the job without them, and says so)."""
    for host, dev in zip(hosts.ns, hosts.devs, strict=True):
        done = sh("ip", "netns", "exec", hosts.ns[host], "tc", "qdisc", "add", "dev", dev,
                  "root", "netem", *NETEM, check=False)  # fmt: skip
        if done.returncode != 0:
            return f"NO jitter (tc netem: {done.stderr.strip() or done.returncode})"
    return f"netem {' '.join(NETEM)} on both ends"


def _loss(hosts: TwoHosts, percent: float) -> str:
    """Drop ``percent`` of the packets each end of the veth receives; in words."""
    if percent <= 0:
        return "no loss"
    for host, dev in zip(hosts.ns, hosts.devs, strict=True):
        sh(*hosts.exec(host, "iptables", "-A", "INPUT", "-i", dev, "-m", "statistic",
                       "--mode", "random", "--probability", f"{percent / 100:.6f}", "-j",
                       "DROP"))  # fmt: skip
    return f"{percent:g}% loss each way (iptables statistic)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Tally:
    """Every rank's lines as they come: digests, reruns, failures, rank 0's call times."""

    def __init__(self, job: NetJob) -> None:
        self.digests: list[list[str]] = [[] for _ in range(4)]
        self.reruns = [0] * 4
        self.failures: list[str] = []
        self.times: list[float] = []
        self._started: float | None = None
        for rank, proc in enumerate(job.procs):
            threading.Thread(target=self._read, args=(rank, proc), daemon=True).start()

    def _read(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode().rstrip("\n")
            word = line.split(" ", 1)[0]
            if word == "digest":
                self.digests[rank].append(line.split()[2])
                if rank == 0 and self._started is not None:
                    self.times.append(time.monotonic() - self._started)
            elif word == "iter" and rank == 0:
                self._started = time.monotonic()
            elif word == "rerun":
                self.reruns[rank] += 1
            elif word == "failed":
                self.failures.append(f"rank {rank}: {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="how long the job runs")
    parser.add_argument("--load", type=int, default=2, help="busy processes beside the job")
    parser.add_argument("--count", type=int, default=1 << 18, help="float32 per all_reduce")
    parser.add_argument("--loss", type=float, default=1.0, help="percent of packets dropped")
    args = parser.parse_args()
    exact = _exact(args.count)
    hosts = TwoHosts()
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        jitter = f"{_netem(hosts)}, {_loss(hosts, args.loss)}"
        with tempfile.TemporaryDirectory() as tmp:
            job = NetJob(
                hosts, Path(tmp), _free_port(), timeout_s=60.0, iters=10**9, worker=WORKER,
                extra={"CCLCTL_RETRY_BUDGET": "30", "COUNT": str(args.count)},
            )  # fmt: skip
            tally = Tally(job)
            hogs = [
                subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(args.load)
            ]
            deadline = time.monotonic() + args.seconds
            while time.monotonic() < deadline and not tally.failures:
                time.sleep(1.0)  # the job runs on by itself; this only waits out the run
            job.kill_ranks()
            hosts.kill_all()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        hosts.close()
    done = min(len(d) for d in tally.digests)
    right = sum(all(d[i] == exact for d in tally.digests) for i in range(done))
    times = sorted(tally.times)
    print(f"{args.seconds:g} s, {jitter}, {args.load} busy processes")
    print(f"calls completed by every rank: {done}, exact: {right}")
    print(f"retries (links renewed) per rank: {tally.reruns}; failures: {len(tally.failures)}")
    if times:
        p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
        print(f"rank 0's call time: median {statistics.median(times) * 1e3:.0f} ms, "
              f"p99 {p99 * 1e3:.0f} ms, max {times[-1] * 1e3:.0f} ms")  # fmt: skip
    for line in tally.failures[:4]:
        print(line)


if __name__ == "__main__":
    main()
