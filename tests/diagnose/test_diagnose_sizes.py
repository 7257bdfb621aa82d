"""Every kind of verdict at 1, 2, 4, 64 and 4,096 ranks; order independence; clock skew."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from diagnose_factory import T0, Job, ring_left

from cclctl.diagnose.engine import diagnose
from cclctl.diagnose.model import Diagnosis
from cclctl.records import RankSnapshot

SIZES = (1, 2, 4, 64, 4096)

Scenario = tuple[list[RankSnapshot], dict[str, Any], list[tuple[str, str]]]


def suspect(n: int) -> int:
    """The faulty rank: in the middle, so it is neither first nor last."""
    return n // 2


def others(n: int) -> list[int]:
    return [r for r in range(n) if r != suspect(n)]


def healthy(n: int) -> Scenario:
    return Job(n).snapshots(), {}, [("healthy", "")]


def dead(n: int) -> Scenario:
    k = suspect(n)
    job = Job(n).enter(others(n), waiting_on=lambda r: k).enter([k])
    return job.snapshots(), {"proc": {k: "gone"}}, [("dead", str(k))]


def stopped(n: int) -> Scenario:
    k = suspect(n)
    job = Job(n).enter(range(n), waiting_on=lambda r: None if r == k else k)
    return job.snapshots(), {"proc": {k: "stopped"}}, [("stopped", str(k))]


def stale(n: int) -> Scenario:
    k = suspect(n)
    job = Job(n).enter(range(n), waiting_on=lambda r: None if r == k else k).stale([k], 60)
    return job.snapshots("status"), {"now_ns": T0}, [("stale", str(k))]


def missing(n: int) -> Scenario:
    k = suspect(n)
    job = Job(n).enter(others(n), waiting_on=lambda r: k)
    return job.snapshots(without=[k]), {"world_size": n}, [("missing", str(k))]


def not_entered(n: int) -> Scenario:
    k = suspect(n)
    job = Job(n).enter(others(n), waiting_on=lambda r: k)
    return job.snapshots(), {}, [("not_entered", str(k))]


def mismatch(n: int) -> Scenario:
    k = suspect(n)
    job = Job(n).enter(others(n), waiting_on=lambda r: k)
    job.enter([k], op="broadcast", root=0)
    return job.snapshots(), {}, [("mismatch", str(k))]


def link(n: int) -> Scenario:
    k = suspect(n)
    waits = {r: k for r in range(n)} | {k: k - 1, k - 1: k}
    job = Job(n).enter(range(n), waiting_on=waits)
    return job.snapshots(), {}, [("link", f"{k - 1}-{k}")]


def busy(n: int) -> Scenario:
    k = suspect(n)
    job = Job(n).enter(range(n), waiting_on=lambda r: None if r == k else k)
    return job.snapshots(), {}, [("stuck", str(k))]


def lone_hang(n: int) -> Scenario:
    return Job(n).enter(range(n)).snapshots(), {}, [("stuck", "")]


SCENARIOS: dict[str, tuple[Callable[[int], Scenario], int]] = {
    # name: (builder, smallest world size where the fault can exist)
    "healthy": (healthy, 1),
    "dead": (dead, 1),
    "stopped": (stopped, 1),
    "stale": (stale, 1),
    "missing": (missing, 2),
    "not_entered": (not_entered, 2),
    "mismatch": (mismatch, 2),
    "link": (link, 2),
    "busy": (busy, 2),
    "lone_hang": (lone_hang, 1),
}
CASES = [(name, n) for name, (_, low) in SCENARIOS.items() for n in SIZES if n >= low]


def verdicts_of(diag: Diagnosis) -> list[tuple[str, str]]:
    return [(v.kind, v.ranks) for v in diag.verdicts]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("name", "n"), CASES, ids=[f"{k}-{n}" for k, n in CASES])
def test_golden_verdict_at_every_size(name: str, n: int):
    snaps, kwargs, expected = SCENARIOS[name][0](n)
    diag = diagnose(snaps, **kwargs)
    assert verdicts_of(diag) == expected
    assert diag.fault == (name != "healthy")
    assert diag.world_size == n
    if expected[0][1]:
        rank = int(expected[0][1].split("-")[-1])
        assert rank in [s.rank for s in diag.verdicts[0].suspects]


def canonical(diag: Diagnosis) -> str:
    return json.dumps(diag.to_dict(), sort_keys=True)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_input_order_does_not_matter(name: str):
    snaps, kwargs, _ = SCENARIOS[name][0](64)
    reference = canonical(diagnose(snaps, **kwargs))
    rng = random.Random(name)
    for _ in range(3):
        shuffled = list(snaps)
        rng.shuffle(shuffled)
        for snap in shuffled:  # records of a rank may come in any order too
            rng.shuffle(snap.records)
        assert canonical(diagnose(shuffled, **kwargs)) == reference


SKEWS = {"host-0": -8.0, "host-1": 7.5, "host-2": 3.0, "host-5": -4.0}


def skewed(job: Job) -> Job:
    job.skew_s = dict(SKEWS)
    return job


@pytest.mark.parametrize("kind", ["dump", "status"])
def test_clock_skew_between_hosts_gives_no_false_verdict(kind: str):
    job = skewed(Job(64).enter(range(64), age_s=0.5, waiting_on=ring_left(64)))
    diag = diagnose(job.snapshots(kind), now_ns=T0 if kind == "status" else None)
    assert verdicts_of(diag) == [("healthy", "")]


@pytest.mark.parametrize("kind", ["dump", "status"])
def test_clock_skew_between_hosts_leaves_the_verdict_unchanged(kind: str):
    def build() -> Job:
        return Job(64).enter(others(64), waiting_on=lambda r: suspect(64))

    now = T0 if kind == "status" else None
    plain = diagnose(build().snapshots(kind), now_ns=now)
    skew = diagnose(skewed(build()).snapshots(kind), now_ns=now)
    assert verdicts_of(plain) == [("not_entered", "32")]
    assert canonical(skew) == canonical(plain)


def test_local_processes_are_judged_without_the_skew_margin():
    """A rank on this host shares the reader's clock, so 12 s of silence is stale already."""
    job = Job(4).stale([1], 12)
    statuses = job.snapshots("status")
    assert not diagnose(statuses, now_ns=T0).fault  # on another host: within the margin
    local = diagnose(statuses, now_ns=T0, proc={r: "running" for r in range(4)})
    assert verdicts_of(local) == [("stale", "1")]
