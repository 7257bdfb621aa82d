"""How fast and how right `cclctl diagnose slow` names a slow link or a slow host, live, on
jobs across network-namespace hosts (issue #35; root needed; asserts nothing).

Each case puts 4 hosts on a bridge (``BridgedHosts`` of tests/probe/probe_hosts.py, one
rank each), runs the slow-job worker on them (tests/support/slow_worker.py: 20 ms of
compute, then an all_reduce or an all_to_all of 256 KiB, then a broadcast), and once the
job is judged healthy slows, with the system's own tools:

- one directed link src -> dst: htb with a u32 filter on src's device, for the data
  packets to dst (all_to_all: any pair; all_reduce: a link of its ring, i -> i+1);
- one host's egress: tbf on its device (all_to_all, so it sends to every other host).

It then polls `cclctl diagnose slow --store ... --json` on h0; the latency runs from the
moment ``tc`` returned to the first verdict that names exactly the fault (``slow_link``
with that direction, or ``slow_host`` with that host). Any other finding, or any finding
before the fault, is a false positive; no right verdict within ``--deadline`` is a miss.
Healthy controls (two busy loops of CPU load) must give no finding.

    .venv/bin/python benchmarks/slow_detection_links.py [--cases 8] [--controls 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "support")]

from netns_job import TOKEN  # noqa: E402
from ports import free_port  # noqa: E402
from quantiles import percentile  # noqa: E402
from slow_hosts import BridgedHosts, SlowHostsJob  # noqa: E402

HOSTS = 4


@dataclass
class Case:
    """One run: ``kind`` is "link", "host" or "healthy"."""

    kind: str
    op: str = "all_to_all"
    src: int = -1  # the slowed link's ends (ranks = hosts here), or the slowed host
    dst: int = -1
    rate: str = ""

    def describe(self) -> str:
        if self.kind == "link":
            return f"slow_link {self.src}->{self.dst} {self.op} {self.rate}"
        if self.kind == "host":
            return f"slow_host h{self.src} egress {self.op} {self.rate}"
        return f"healthy {self.op} + 2 busy loops"

    def right(self, finding: dict[str, Any]) -> bool:
        if self.kind == "link":
            return finding["kind"] == "slow_link" and finding["link"] == [self.src, self.dst]
        if self.kind == "host":
            return finding["kind"] == "slow_host" and finding["host"] == f"h{self.src}"
        return False


@dataclass
class Outcome:
    case: Case
    latency_s: float | None = None
    wrong: list[str] = field(default_factory=list)
    polls: int = 0
    last: dict[str, Any] | None = None  # the last verdict read after the fault


def suite(cases: int, controls: int, seed: int) -> list[Case]:
    rng = random.Random(seed)
    out = []
    for i in range(cases):
        rate = f"{rng.choice((20, 40, 80, 160))}mbit"
        if i % 4 == 3:
            out.append(Case("host", "all_to_all", rng.randrange(HOSTS), rate=rate))
            continue
        src = rng.randrange(HOSTS)
        if i % 2 == 0:
            out.append(Case("link", "all_reduce", src, (src + 1) % HOSTS, rate))
        else:
            dst = rng.choice([h for h in range(HOSTS) if h != src])
            out.append(Case("link", "all_to_all", src, dst, rate))
    out += [Case("healthy", ("all_reduce", "all_to_all")[i % 2]) for i in range(controls)]
    return out


def verdict(hosts: BridgedHosts, job: SlowHostsJob) -> dict[str, Any] | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    env["CCLCTL_TOKEN"] = TOKEN
    proc = subprocess.run(
        ["ip", "netns", "exec", hosts.ns["h0"], sys.executable, "-m", "cclctl", "diagnose",
         "slow", "--store", job.store, "--job", job.job, "--json"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    return json.loads(proc.stdout) if proc.returncode in (0, 3) else None


def run_case(case: Case, deadline_s: float) -> Outcome:
    out = Outcome(case)
    hosts = BridgedHosts(HOSTS)
    busy: list[subprocess.Popen[bytes]] = []
    job = None
    try:
        job = SlowHostsJob(hosts, Path(tempfile.mkdtemp(prefix="cclctl-slowlinks-")),
                           free_port(), OP=case.op, COUNT=str(1 << 16))  # fmt: skip
        started = time.monotonic()
        while True:  # until the job is judged, healthy
            doc = verdict(hosts, job)
            out.polls += 1
            if doc is not None:
                out.wrong += [f"{f['kind']} {f['ranks']} (before)" for f in doc["findings"]]
                if doc["status"] == "healthy":
                    break
            if time.monotonic() - started > 90:
                out.wrong.append("never judged healthy")
                return out
            time.sleep(0.2)
        if case.kind == "link":
            hosts.slow_link(f"h{case.src}", f"h{case.dst}", case.rate)
        elif case.kind == "host":
            hosts.slow_host(f"h{case.src}", case.rate)
        else:
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        fault_at = time.monotonic()
        while time.monotonic() - fault_at < deadline_s:
            doc = verdict(hosts, job)
            out.polls += 1
            if doc is None:
                continue
            out.last = doc
            found = doc["findings"]
            wrong = [f"{f['kind']} {f['link'] or f['host'] or f['ranks']}" for f in found
                     if not case.right(f)]  # fmt: skip
            out.wrong += wrong
            if found and not wrong:
                out.latency_s = time.monotonic() - fault_at
                return out
        return out
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
        if job is not None:
            job.kill()
        hosts.close()


def report(outcomes: list[Outcome]) -> None:
    injected = [o for o in outcomes if o.case.kind != "healthy"]
    tp = sum(1 for o in injected if o.latency_s is not None)
    fp = sum(len(set(o.wrong)) for o in outcomes)
    for o in outcomes:
        lat = f"{o.latency_s:5.1f}s" if o.latency_s is not None else "     -"
        if o.latency_s is None and o.case.kind != "healthy":
            lat = "  miss"
        print(f"{o.case.describe():44s} {lat}  polls={o.polls:3d} wrong={sorted(set(o.wrong))}")
        if o.latency_s is None and o.case.kind != "healthy" and o.last is not None:
            print(f"    missed: the last verdict was {o.last['status']}: {o.last['reason']}")
    print(f"\ninjected {len(injected)}, detected {tp}, false positives {fp} "
          f"(controls {len(outcomes) - len(injected)})")  # fmt: skip
    print(f"recall {tp / max(len(injected), 1):.2f}  precision {tp / max(tp + fp, 1):.2f}")
    latencies = [o.latency_s for o in injected if o.latency_s is not None]
    if latencies:
        p50, p90 = percentile(latencies, 0.5), percentile(latencies, 0.9)
        print(f"latency from the fault's start: p50 {p50:.1f}s p90 {p90:.1f}s "
              f"max {max(latencies):.1f}s (target p90 <= 10s)")  # fmt: skip
    print(f"load average at the end: {os.getloadavg()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=8, help="injected cases (8)")
    parser.add_argument("--controls", type=int, default=2, help="healthy controls (2)")
    parser.add_argument("--deadline", type=float, default=30, help="seconds to find a fault")
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--only", default="", help="run only these cases of the suite: 2,5")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: network namespaces and tc")
    cases = suite(args.cases, args.controls, args.seed)
    if args.only:
        cases = [cases[int(i)] for i in args.only.split(",")]
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    outcomes = []
    for case in cases:
        outcomes.append(run_case(case, args.deadline))
        o = outcomes[-1]
        print(f"  {case.describe()}: latency={o.latency_s} wrong={o.wrong[:3]}", flush=True)
    report(outcomes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
