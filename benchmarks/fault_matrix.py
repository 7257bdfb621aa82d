"""The fault matrix of issue 24: does every witness name the culprit? (asserts nothing)

Each case runs tests/support/fault_worker.py with one ``CCLCTL_FAULT`` striking rank N-2 at
seq 5 (a cut link: its link to rank N-1), then counts how many survivors' error lines name
the culprit and whether three verdicts do: the live one (``cclctl diagnose hang --store``
as soon as a rank has failed, while the store still answers), the post-mortem one
(``cclctl diagnose hang DIR`` once every rank has ended) and ``cclctl launch``'s last line.
Faults x ranks x collectives x launch mode x transport: 7 x 2 x 3 x 2 x 2 = 168 cases, run
one at a time (safe on 2 cores); a progress line per case on stderr, the table (markdown)
on stdout::

    python benchmarks/fault_matrix.py                                # all 168 cases
    python benchmarks/fault_matrix.py --faults kill,stop --ranks 4   # a subset

``env`` mode starts the ranks from the environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), rank 0 hosting the store, as srun or mpirun would; it has no launcher line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from cclctl.ranges import parse_ranks

PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "tests" / "support" / "fault_worker.py")
SEQ = 5
TIMEOUT_S = 2.0  # CCLCTL_TIMEOUT: hangs (stop, sleep, skip) expire after it
CASE_DEADLINE_S = 40.0
FAULTS = {
    "kill": "kill:rank={c}:seq=5",
    "stop": "stop:rank={c}:seq=5",
    "sleep": "sleep:rank={c}:seq=5:secs=6",
    "skip": "skip:rank={c}:seq=5",
    "op": "op:rank={c}:seq=5:to={other}",
    "count": "count:rank={c}:seq=5:to=7",
    "link": "link:rank={c}:seq=5:peer={peer}",
}
OPS = ("all_reduce", "all_gather", "broadcast")
FAILED_LINE = re.compile(r"rank (\d+) failed: (.*)")


@dataclasses.dataclass(frozen=True)
class Case:
    fault: str
    ranks: int
    op: str
    mode: str  # "launch" or "env"
    transport: str  # "shm" or "tcp"

    @property
    def culprits(self) -> tuple[int, ...]:
        c = self.ranks - 2
        return (c, c + 1) if self.fault == "link" else (c,)

    def plan(self) -> str:
        c = self.ranks - 2
        other = "all_reduce" if self.op != "all_reduce" else "broadcast"
        return FAULTS[self.fault].format(c=c, peer=c + 1, other=other)

    def label(self) -> str:
        return f"{self.fault} n={self.ranks} {self.op} {self.mode} {self.transport}"


@dataclasses.dataclass
class Outcome:
    survivors: int = 0
    named: int = 0
    live: str = "none"  # "right", "wrong" or "none" (no answer)
    post: str = "none"
    launcher: str = "n/a"


def names(text: str, culprits: tuple[int, ...]) -> bool:
    """The first rank a text blames (``rank k`` or ``peer k``) is a culprit."""
    found = re.findall(r"\b(?:rank|peer|ranks) (\d+)\b", text)
    return bool(found) and int(found[0]) in culprits


def verdict_names(doc: dict[str, object], culprits: tuple[int, ...]) -> str:
    verdicts = [v for v in doc.get("verdicts", []) if v.get("kind") != "healthy"]  # type: ignore[union-attr]
    if not verdicts:
        return "wrong"
    first = verdicts[0]
    suspects = first.get("suspects") or ""
    folded = parse_ranks(suspects) if isinstance(suspects, str) and suspects else []
    ranks = set(first.get("link") or folded)
    return "right" if ranks and ranks <= set(culprits) else "wrong"


def diagnose(args: list[str], culprits: tuple[int, ...]) -> str:
    done = subprocess.run(
        [PY, "-m", "cclctl", "diagnose", "hang", "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode not in (0, 3):
        return "none"
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        return "none"
    judged = verdict_names(doc, culprits)
    if judged == "wrong" and os.environ.get("MATRIX_VERBOSE"):
        print(f"  wrong: {[(v['kind'], v['suspects']) for v in doc['verdicts']]}", file=sys.stderr)
    return judged


def base_env(case: Case, dumps: str, job: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    env.update(
        CCLCTL_FAULT=case.plan(),
        CCLCTL_TIMEOUT=str(TIMEOUT_S),
        CCLCTL_TRACE_DIR=dumps,
        CCLCTL_STATUS_INTERVAL="0.2",
        CCLCTL_JOB=job,
        CCLCTL_TRANSPORT="tcp" if case.transport == "tcp" else "auto",
        FAULT_OP=case.op,
        ITERS="8",
        PAUSE="0.1",
        HOLD_ON_ERROR="0",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    return env


class Reader:
    """Collect a process's stderr lines; ``failed`` is set at the first rank's error line."""

    def __init__(self, stream, rank: int | None = None) -> None:  # type: ignore[no-untyped-def]
        self.lines: list[str] = []
        self.rank = rank
        self.failed = threading.Event()
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:  # type: ignore[no-untyped-def]
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines.append(line)
            if FAILED_LINE.search(line):
                self.failed.set()

    def errors(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for line in self.lines:
            m = FAILED_LINE.search(line)
            if m:
                out.setdefault(int(m.group(1)), m.group(2))
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGCONT and SIGTERM what still runs (it dumps), then SIGKILL after a grace."""
    for p in procs:
        if p.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGCONT):
                os.killpg(p.pid, sig)
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def run_launch(case: Case, dumps: str, job: str) -> tuple[dict[int, str], str, str]:
    """A ``cclctl launch`` case: (errors by rank, live verdict, the launcher's last line)."""
    cmd = [PY, "-m", "cclctl", "launch", "-n", str(case.ranks), "--grace", "2", "--", PY, WORKER]
    env = base_env(case, dumps, job)
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    reader = Reader(proc.stderr)
    live = "none"
    try:
        if reader.failed.wait(CASE_DEADLINE_S):
            address = _launch_store(reader.lines)
            if address:
                live = diagnose(["--store", address, "--job", job], case.culprits)
        proc.wait(CASE_DEADLINE_S)
    except subprocess.TimeoutExpired:
        pass
    finally:
        stop_all([proc])
        reader.thread.join(5)
    last = reader.lines[-1] if reader.lines else ""
    return reader.errors(), live, last


def _launch_store(lines: list[str]) -> str:
    for line in lines:
        m = re.match(r"cclctl: job \S+ store (\S+);", line)
        if m:
            return m.group(1)
    return ""


def run_env(case: Case, dumps: str, job: str) -> tuple[dict[int, str], str]:
    """An env-launched case, rank 0 hosting the store: (errors by rank, live verdict)."""
    port = free_port()
    procs, readers = [], []
    for rank in range(case.ranks):
        env = base_env(case, dumps, job)
        env.update(RANK=str(rank), WORLD_SIZE=str(case.ranks), LOCAL_RANK=str(rank))
        env.update(LOCAL_WORLD_SIZE=str(case.ranks), MASTER_ADDR="127.0.0.1")
        env.update(MASTER_PORT=str(port))
        proc = subprocess.Popen(
            [PY, WORKER],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        procs.append(proc)
        readers.append(Reader(proc.stderr, rank))
    live = "none"
    try:
        deadline = time.monotonic() + CASE_DEADLINE_S
        while time.monotonic() < deadline and not any(r.failed.is_set() for r in readers):
            time.sleep(0.02)
        live = diagnose(["--store", f"127.0.0.1:{port}", "--job", job], case.culprits)
        _wait_for_survivors(procs, case, deadline)
    finally:
        stop_all(procs)
    errors: dict[int, str] = {}
    for r in readers:
        r.thread.join(5)
        errors.update(r.errors())
    return errors, live


def _wait_for_survivors(procs: list[subprocess.Popen[bytes]], case: Case, deadline: float) -> None:
    """Until every rank but the culprits ended (their errors are in), or the deadline."""
    others = [p for r, p in enumerate(procs) if r not in case.culprits]
    while time.monotonic() < deadline and any(p.poll() is None for p in others):
        time.sleep(0.05)


def run_case(case: Case) -> Outcome:
    job = f"matrix-{os.getpid()}-{time.monotonic_ns() % 10**8}"
    with tempfile.TemporaryDirectory(prefix="cclctl-matrix-") as dumps:
        out = Outcome()
        if case.mode == "launch":
            errors, out.live, last = run_launch(case, dumps, job)
            origin = last.split(";")[0] if last.startswith("cclctl launch:") else ""
            out.launcher = "right" if origin and names(origin, case.culprits) else "wrong"
        else:
            errors, out.live = run_env(case, dumps, job)
        survivors = [r for r in range(case.ranks) if r not in case.culprits]
        out.survivors = len(survivors)
        out.named = sum(
            1 for r in survivors if r in errors and names(_blame(errors[r], r), case.culprits)
        )
        out.post = diagnose([dumps, "--job", job], case.culprits)
    return out


def _blame(text: str, rank: int) -> str:
    """An error line without the rank's own name in front (``rank 4: ...``)."""
    return re.sub(
        rf"^(collective mismatch: )?rank {rank}(:| called \S+ at seq \d+ epoch \d+ but)", "", text
    )


def cases(args: argparse.Namespace) -> Iterator[Case]:
    for fault in args.faults:
        for transport in args.transports:
            for ranks in args.ranks:
                for op in args.ops:
                    for mode in args.modes:
                        yield Case(fault, ranks, op, mode, transport)


def table(results: list[tuple[Case, Outcome]]) -> str:
    rows = [
        "| fault | transport | cases | survivors naming the culprit | live right (no answer) "
        "| post-mortem right | launcher right |",
        "|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[Outcome]] = {}
    for case, out in results:
        groups.setdefault((case.fault, case.transport), []).append(out)
    for (fault, transport), outs in groups.items():
        launched = [o for o in outs if o.launcher != "n/a"]
        rows.append(
            f"| {fault} | {transport} | {len(outs)} "
            f"| {sum(o.named for o in outs)}/{sum(o.survivors for o in outs)} "
            f"| {sum(o.live == 'right' for o in outs)} ({sum(o.live == 'none' for o in outs)}) "
            f"| {sum(o.post == 'right' for o in outs)} "
            f"| {sum(o.launcher == 'right' for o in launched)}/{len(launched)} |"
        )
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--faults", default=",".join(FAULTS), help="comma list of " + ",".join(FAULTS))
    p.add_argument("--ranks", default="4,8", help="comma list of world sizes")
    p.add_argument("--ops", default=",".join(OPS), help="comma list of collectives")
    p.add_argument("--modes", default="launch,env", help="launch and/or env")
    p.add_argument("--transports", default="shm,tcp", help="shm and/or tcp")
    args = p.parse_args(argv)
    args.faults = _choices(p, "--faults", args.faults, FAULTS)
    args.ranks = [int(r) for r in args.ranks.split(",")]
    if any(r < 3 for r in args.ranks):
        p.error("--ranks: every world size must be at least 3 (culprit N-2, its link to N-1)")
    args.ops = _choices(p, "--ops", args.ops, OPS)
    args.modes = _choices(p, "--modes", args.modes, ("launch", "env"))
    args.transports = _choices(p, "--transports", args.transports, ("shm", "tcp"))
    return args


def _choices(p: argparse.ArgumentParser, flag: str, text: str, known: object) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in known]  # type: ignore[operator]
    if bad or not items:
        p.error(f"{flag}: unknown {', '.join(bad) or 'empty list'}")
    return items


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    todo = list(cases(args))
    results = []
    for i, case in enumerate(todo, 1):
        started = time.monotonic()
        out = run_case(case)
        results.append((case, out))
        print(
            f"[{i}/{len(todo)}] {case.label()}: survivors {out.named}/{out.survivors}, "
            f"live {out.live}, post-mortem {out.post}, launcher {out.launcher} "
            f"({time.monotonic() - started:.1f}s)",
            file=sys.stderr,
            flush=True,
        )
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
