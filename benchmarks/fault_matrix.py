"""The fault matrix of issue 24: does every witness name the culprit? (asserts nothing)

Each case runs tests/support/fault_worker.py with one ``CCLCTL_FAULT`` striking rank N-2 at
seq 5 (a cut link: its link to rank N-1), then counts how many survivors' error lines name
the culprit and whether three verdicts do: the live one (``cclctl diagnose hang --store``
as soon as a rank has failed, while the store still answers), the post-mortem one
(``cclctl diagnose hang DIR`` once every rank has ended) and ``cclctl launch``'s last line.
A fault may fail nothing (a rank that sleeps before a broadcast whose peers, ahead in the
shared-memory slots, never wait on it): the job completes, and the right verdict is then a
healthy one, with no one blamed (the table counts such jobs).
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
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_matrix_cases import FAULTS, OPS, PY, Case, run_env, run_launch

from cclctl.ranges import parse_ranks


@dataclasses.dataclass
class Outcome:
    survivors: int = 0  # survivors that raised an error (the others finished cleanly)
    named: int = 0
    finished: int = 0  # survivors the fault never reached (a broadcast leaf's peers)
    live: str = "none"  # "right", "wrong" or "none" (no answer)
    post: str = "none"
    launcher: str = "n/a"
    completed: bool = False  # every rank exited 0: right is a healthy verdict, no blame


def names(text: str, culprits: tuple[int, ...]) -> bool:
    """The first rank a text blames (``rank k`` or ``peer k``) is a culprit."""
    found = re.findall(r"\b(?:rank|peer|ranks) (\d+)\b", text)
    return bool(found) and int(found[0]) in culprits


def verdict_names(doc: dict[str, object], culprits: tuple[int, ...]) -> str:
    """Whether the first verdict names a culprit; with no culprits (a job that completed),
    whether the verdict is healthy."""
    verdicts = [v for v in doc.get("verdicts", []) if v.get("kind") != "healthy"]  # type: ignore[union-attr]
    if not culprits:
        return "wrong" if verdicts else "right"
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


def run_case(case: Case) -> Outcome:
    job = f"matrix-{os.getpid()}-{time.monotonic_ns() % 10**8}"

    def judge(args: list[str]) -> str:
        return diagnose(args, case.culprits)

    with tempfile.TemporaryDirectory(prefix="cclctl-matrix-") as dumps:
        out = Outcome()
        ran = (run_launch if case.mode == "launch" else run_env)(case, dumps, job, judge)
        errors, out.live, out.completed = ran.errors, ran.live, ran.completed
        if case.mode == "launch" and ran.completed:
            out.launcher = "right"  # it exits 0 and blames no one
        elif case.mode == "launch":
            origin = ran.last.split(";")[0] if ran.last.startswith("cclctl launch:") else ""
            out.launcher = "right" if origin and names(origin, case.culprits) else "wrong"
        survivors = [r for r in range(case.ranks) if r not in case.culprits]
        failed = [r for r in survivors if errors.get(r)]
        out.survivors, out.finished = len(failed), len(survivors) - len(failed)
        named = [r for r in failed if names(_blame(errors[r], r), case.culprits)]
        out.named = len(named)
        if os.environ.get("MATRIX_VERBOSE"):
            for r in sorted(set(failed) - set(named)):
                print(f"  rank {r} said: {errors[r][:300]}", file=sys.stderr)
        out.post = diagnose([dumps, "--job", job], () if ran.completed else case.culprits)
    return out


def _blame(text: str, rank: int) -> str:
    """An error line without the rank's own name in front (``rank 4: ...``)."""
    text = re.sub(
        rf"^(collective mismatch: )?rank {rank}(:| called \S+ at seq \d+ epoch \d+ but)", "", text
    )  # and what its own call waited on: the origin comes after it
    return re.sub(r"waiting to (recv from|send to) rank \d+: ", "", text)


def cases(args: argparse.Namespace) -> Iterator[Case]:
    for fault in args.faults:
        for transport in args.transports:
            for ranks in args.ranks:
                for op in args.ops:
                    for mode in args.modes:
                        yield Case(fault, ranks, op, mode, transport)


def table(results: list[tuple[Case, Outcome]]) -> str:
    rows = [
        "| fault | transport | cases | jobs completed | failed survivors naming the culprit "
        "(finished) | live right (no answer) | post-mortem right | launcher right |",
        "|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[Outcome]] = {}
    for case, out in results:
        groups.setdefault((case.fault, case.transport), []).append(out)
    for (fault, transport), outs in groups.items():
        launched = [o for o in outs if o.launcher != "n/a"]
        rows.append(
            f"| {fault} | {transport} | {len(outs)} | {sum(o.completed for o in outs)} "
            f"| {sum(o.named for o in outs)}/{sum(o.survivors for o in outs)} "
            f"({sum(o.finished for o in outs)}) "
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
            f"[{i}/{len(todo)}] {case.label()}: {'job completed, ' if out.completed else ''}"
            f"survivors {out.named}/{out.survivors} "
            f"({out.finished} finished), "
            f"live {out.live}, post-mortem {out.post}, launcher {out.launcher} "
            f"({time.monotonic() - started:.1f}s)",
            file=sys.stderr,
            flush=True,
        )
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
