"""How fast and how right `cclctl diagnose slow` is on real launched jobs (issue #35).

Each case launches a training-like job (benchmarks/slow_detection_worker.py) with
`cclctl launch -n N`, over shared memory or TCP (CCLCTL_TRANSPORT=tcp), and slows one
rank by 15-50% from a collective a few seconds in: by CCLCTL_FAULT's slow plan
(``factor``) or by the rank computing more itself. From the job's first step the benchmark
runs `cclctl diagnose slow --store ... --json` over and over; the detection latency is
the time from the fault's start (the wall time the slow rank writes) to the first answer
that names ``slow_rank`` with exactly the injected rank. Any finding that names another
kind or rank, or any finding before the fault, is a false positive; no right finding
within ``--deadline`` seconds is a miss. Healthy controls (jitter on every rank, and two
busy loops of CPU load started and ended by pid) must give no finding at all.
``--minutes`` adds one long healthy run under jitter and load (4 ranks, 2 busy loops),
over shared memory or, with ``--long-transport tcp``, TCP.

Slow links and hosts are not in this suite: they need network-namespace hosts (root,
veths, tc); benchmarks/slow_detection_links.py measures those cases.

    .venv/bin/python benchmarks/slow_detection.py --quick
    .venv/bin/python benchmarks/slow_detection.py --cases 24 --controls 4 --minutes 5

``--only 2,3`` runs those cases of the suite (numbered from 0, as listed); ``--save DIR``
keeps every rank's status at every poll that did not name the fault (healthy controls: every
poll), and ``--replay FILE`` prints the
analysis' verdict on one such file, so a wrong finding can be studied without its job.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantiles import percentile

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "slow_detection_worker.py")
CCLCTL = str(Path(sys.executable).with_name("cclctl"))


@dataclass
class Case:
    """One run: ``slow`` is None for a healthy control."""

    ranks: int
    transport: str
    slow: int | None = None
    share: float = 0.0
    how: str = "plan"
    load: int = 0
    jitter: float = 0.0
    watch_s: float = 20.0


@dataclass
class Outcome:
    case: Case
    latency_s: float | None = None
    wrong: list[str] = field(default_factory=list)
    polls: int = 0
    answered: int = 0  # polls that got a verdict from the live job
    judged: bool = False
    last: dict[str, Any] | None = None  # the last verdict read


def suite(cases: int, controls: int, seed: int, deadline: float, control_s: float) -> list[Case]:
    rng = random.Random(seed)
    out = []
    for i in range(cases):
        n = (4, 8)[i % 2]
        transport = ("shm", "tcp")[(i // 2) % 2]
        how = ("plan", "compute")[(i // 4) % 2]
        share = round(rng.uniform(0.15, 0.5), 2)
        out.append(Case(n, transport, rng.randrange(n), share, how, watch_s=deadline))
    for i in range(controls):
        n, transport = (4, 8)[i % 2], ("shm", "tcp")[(i // 2) % 2]
        out.append(Case(n, transport, load=2 if i % 2 == 0 else 0, jitter=0.3, watch_s=control_s))
    return out


def busy_loops(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def diagnose(store: str, job: str) -> dict[str, Any] | None:
    """The CLI's ``cclctl.slow`` document, as a user polling the job reads it."""
    proc = subprocess.run(
        [CCLCTL, "diagnose", "slow", "--store", store, "--job", job, "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if proc.returncode not in (0, 3):
        return None
    return json.loads(proc.stdout)


def save_statuses(store: str, job: str, into: Path, label: str) -> None:
    """Every rank's status as the store holds it now, one JSON file (``--save``), so a
    wrong verdict can be replayed against the analysis offline (``--replay``)."""
    from cclctl.commands.store_access import connect
    from cclctl.live.snapshot import fetch

    client = connect(store)
    try:
        statuses = fetch(client, job)
    finally:
        client.close()
    into.mkdir(parents=True, exist_ok=True)
    docs = {str(r): s.to_dict() for r, s in sorted(statuses.statuses.items())}
    (into / f"{label}.json").write_text(json.dumps(docs))


def replay(path: Path) -> dict[str, Any]:
    """The analysis' verdict on statuses ``--save`` kept."""
    from cclctl.diagnose_io.inputs import from_live
    from cclctl.diagnose_io.slow_inputs import slow_from_inputs
    from cclctl.live.snapshot import JobStatuses
    from cclctl.records import snapshot_from_dict

    docs = json.loads(path.read_text())
    snaps = {int(r): snapshot_from_dict(d) for r, d in docs.items()}
    newest = max(s.time_ns for s in snaps.values())
    statuses = JobStatuses(next(iter(snaps.values())).job, "saved", newest, snaps)
    return slow_from_inputs(from_live(statuses)).to_dict()


def wrong_findings(doc: dict[str, Any], case: Case, before_fault: bool) -> list[str]:
    bad = []
    for f in doc.get("findings", []):
        named = f"{f['kind']} {f['ranks']}"
        if (
            before_fault
            or case.slow is None
            or (f["kind"], f["ranks"]) != ("slow_rank", [case.slow])
        ):
            bad.append(named)
    return bad


def run_case(case: Case, step_s: float) -> Outcome:
    tmp = Path(tempfile.mkdtemp(prefix="cclctl-slowbench-"))
    job = f"sb-{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, CCLCTL_JOB=job, CCLCTL_SLOW_WINDOW=ARGS.window, STEP_S=str(step_s),
               RELEASE=str(tmp / "release"), MARK=str(tmp / "mark"), JITTER=str(case.jitter),
               CCLCTL_TRACE_DIR=str(tmp / "dumps"),
               GIVE_UP_S=str(case.watch_s + ARGS.fault_after + 120))  # fmt: skip
    if case.transport == "tcp":
        env["CCLCTL_TRANSPORT"] = "tcp"
    if case.slow is not None:
        seq = 2 * int(ARGS.fault_after / step_s) + 1  # an all_reduce, about fault_after in
        env.update(SLOW_RANK=str(case.slow), SLOW_SEQ=str(seq))
        if case.how == "plan":
            env["CCLCTL_FAULT"] = f"slow:rank={case.slow}:seq={seq}:factor={case.share}"
        else:
            env["SLOW_EXTRA"] = str(case.share)
    loops = busy_loops(case.load)
    cmd = [CCLCTL, "launch", "-n", str(case.ranks), "--timeout", str(case.watch_s + 120), "--",
           sys.executable, WORKER]  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    store: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if '{"store"' in line and not store:
                store.append(json.loads(line[line.index("{") :])["store"])
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    out = Outcome(case)
    try:
        if not ready.wait(90):
            out.wrong.append("job never started")
            return out
        watch(out, store[0], job, tmp / "mark")
    finally:
        (tmp / "release").touch()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for loop in loops:
            loop.kill()
            loop.wait()
    return out


def watch(out: Outcome, store: str, job: str, mark: Path) -> None:
    """Poll the verdict until a right finding (latency) or the watch time after the fault."""
    case = out.case
    started = time.time()
    while True:
        doc = diagnose(store, job)
        now = time.time()
        fault_at = float(mark.read_text()) if mark.exists() and mark.stat().st_size else None
        out.polls += 1
        if doc is not None:
            out.answered += 1
            out.last = doc
            out.judged |= doc.get("status") in ("healthy", "slow")
            before = case.slow is not None and (fault_at is None or now < fault_at)
            wrong = wrong_findings(doc, case, before)
            out.wrong += wrong
            right = not before and bool(doc.get("findings")) and fault_at is not None
            if right and fault_at is not None and not wrong_findings(doc, case, False):
                out.latency_s = now - fault_at
                return
            if ARGS.save:
                save_statuses(store, job, Path(ARGS.save) / job, f"poll{out.polls:03d}")
        origin = fault_at if case.slow is not None else started
        if origin is not None and now - origin > case.watch_s:
            return
        if case.slow is not None and fault_at is None and now - started > ARGS.fault_after + 60:
            out.wrong.append("fault never started")
            return


def describe(case: Case) -> str:
    if case.slow is None:
        return f"healthy n={case.ranks} {case.transport} jitter={case.jitter} busy={case.load}"
    return f"slow_rank {case.slow} n={case.ranks} {case.transport} +{case.share:.0%} by {case.how}"


def missed(doc: dict[str, Any], slow: int) -> str:
    """What the last verdict of a missed case saw: the slow rank's share of the window
    inside calls against the others' median, and the job slowdown that gap means."""
    shares = {int(r): f["wait_share"] for r, f in doc.get("ranks", {}).items()}
    if slow not in shares or len(shares) < 2:
        return f"{doc.get('status')}: {doc.get('reason')}"
    mid = statistics.median(v for r, v in shares.items() if r != slow)
    gap = max(0.0, mid - shares[slow])
    return (f"{doc.get('status')}; rank {slow} inside calls {shares[slow]:.0%} of the newest "
            f"window against {mid:.0%} for the others: est. job slowdown "
            f"{1 / (1 - min(gap, 0.95)):.2f}x (finding from 1.15x)")  # fmt: skip


def report(outcomes: list[Outcome]) -> None:
    injected = [o for o in outcomes if o.case.slow is not None]
    tp = sum(1 for o in injected if o.latency_s is not None)
    fp = sum(len(set(o.wrong)) for o in outcomes)
    latencies = [o.latency_s for o in injected if o.latency_s is not None]
    for o in outcomes:
        lat = (
            f"{o.latency_s:5.1f}s"
            if o.latency_s is not None
            else "  miss"
            if o.case.slow is not None
            else "     -"
        )
        print(f"{describe(o.case):48s} {lat}  polls={o.polls:3d} answered={o.answered:3d} "
              f"judged={o.judged} "
              f"wrong={sorted(set(o.wrong))}")  # fmt: skip
        if o.latency_s is None and o.case.slow is not None and o.last is not None:
            print(f"    missed: {missed(o.last, o.case.slow)}")
    print(f"\ninjected {len(injected)}, detected {tp}, false positives {fp} "
          f"(controls {len(outcomes) - len(injected)})")  # fmt: skip
    print(f"recall {tp / max(len(injected), 1):.2f}  precision {tp / max(tp + fp, 1):.2f}")
    if latencies:
        p50, p90 = percentile(latencies, 0.5), percentile(latencies, 0.9)
        print(f"latency from the fault's start: p50 {p50:.1f}s p90 {p90:.1f}s "
              f"max {max(latencies):.1f}s (target p90 <= 10s)")  # fmt: skip
    print(f"load average at the end: {os.getloadavg()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=16, help="injected cases (16)")
    parser.add_argument("--controls", type=int, default=4, help="healthy control runs (4)")
    parser.add_argument("--deadline", type=float, default=30, help="seconds to find a fault (30)")
    parser.add_argument("--control-s", type=float, default=30, help="seconds a control is watched")
    parser.add_argument("--fault-after", type=float, default=6, help="seconds in, the fault")
    parser.add_argument("--window", default="1", help="CCLCTL_SLOW_WINDOW of the ranks (1)")
    parser.add_argument("--step", type=float, default=0.02, help="compute seconds a step")
    parser.add_argument("--minutes", type=float, default=0, help="a long healthy run (0: none)")
    parser.add_argument("--long-transport", choices=("shm", "tcp"), default="shm",
                        help="the transport of the --minutes run (shm)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--quick", action="store_true", help="4 cases, 2 controls of 15 s")
    parser.add_argument("--only", default="", help="run only these cases of the suite: 2,5")
    parser.add_argument("--save", default="", help="keep each poll's statuses here until found")
    parser.add_argument("--replay", default="", help="print the verdict on a saved file")
    global ARGS
    ARGS = parser.parse_args()
    if ARGS.replay:
        print(json.dumps(replay(Path(ARGS.replay)), indent=1))
        return 0
    if ARGS.quick:
        ARGS.cases, ARGS.controls, ARGS.control_s = 4, 2, 15
    cases = suite(ARGS.cases, ARGS.controls, ARGS.seed, ARGS.deadline, ARGS.control_s)
    if ARGS.only:
        cases = [cases[int(i)] for i in ARGS.only.split(",")]
    if ARGS.minutes > 0:
        cases.append(Case(4, ARGS.long_transport, load=2, jitter=0.3, watch_s=ARGS.minutes * 60))
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    outcomes = []
    for case in cases:
        outcomes.append(run_case(case, ARGS.step))
        o = outcomes[-1]
        print(f"  {describe(case)}: latency={o.latency_s} wrong={o.wrong[:3]}", flush=True)
    report(outcomes)
    return 0


ARGS = argparse.Namespace()

if __name__ == "__main__":
    sys.exit(main())
