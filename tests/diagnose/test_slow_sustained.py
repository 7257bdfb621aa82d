"""A straggler that costs the job less than the minimum effect (1.15x) but at least
``sustained_slowdown`` (1.05x) is a finding once it holds ``confirm_sustained`` (5)
consecutive windows; nothing a busy machine does by chance holds that long."""

from __future__ import annotations

import random

import pytest
from slow_factory import Job, signals

from cclctl.diagnose.slow import analyse
from cclctl.diagnose.slow_model import HEALTHY, SLOW_RANK, RankSignals, SlowOptions, SlowReport


def run(job: Job, **options: object) -> SlowReport:
    return analyse(signals(job), job="j", options=SlowOptions(**options))  # type: ignore[arg-type]


def kinds(report: SlowReport) -> list[tuple[str, list[int]]]:
    return [(f.kind, f.ranks) for f in report.findings]


SMALL = 0.08  # the others wait 8% of each window for it: 1.09x


@pytest.mark.parametrize("n", [4, 8])
def test_a_small_straggler_held_five_windows_is_named_with_its_small_cost(n: int) -> None:
    for rank in range(n):
        report = run(Job(n=n, slow={rank}, lag_share=SMALL, windows=5, seed=rank))
        assert kinds(report) == [(SLOW_RANK, [rank])], rank
        finding = report.findings[0]
        assert finding.slowdown == pytest.approx(1 / (1 - SMALL), rel=0.05)
        assert finding.slowdown < 1.15
        assert finding.windows == 5
        assert "under the 1.15x that 2 windows confirm" in finding.evidence[-1]


def test_a_small_straggler_needs_the_whole_run_of_windows() -> None:
    assert run(Job(slow={2}, lag_share=SMALL, windows=4)).status == HEALTHY
    job = Job(slow={2}, lag_share=SMALL, windows=8, slow_in={0, 1, 3, 4, 6, 7})
    assert run(job).status == HEALTHY
    assert kinds(run(job, confirm_sustained=2)) == [(SLOW_RANK, [2])]


def test_below_the_sustained_floor_is_healthy_however_long_and_the_floor_is_configurable() -> None:
    job = Job(slow={1}, lag_share=0.03, windows=12)  # 1.03x
    report = run(job)
    assert report.status == HEALTHY
    assert "nor a rank or host 5% in 5" in report.reason
    assert kinds(run(job, sustained_slowdown=1.02)) == [(SLOW_RANK, [1])]


def test_the_sustained_path_is_off_at_the_minimum_effect() -> None:
    job = Job(slow={1}, lag_share=SMALL, windows=12)
    assert run(job, sustained_slowdown=1.15).status == HEALTHY
    assert "nor a rank" not in run(job, sustained_slowdown=1.15).reason


def _no_entry_waits(ranks: list[RankSignals]) -> list[RankSignals]:
    for rank in ranks:
        for window in rank.windows:
            for peer in window.peers.values():
                peer.entry_wait_ns = 0
    return ranks


def test_late_into_one_call_of_two_it_is_named_for_entering_last_most_often() -> None:
    """A step of two calls, the straggler late into the first only: it enters last in
    half the calls (under ``last_share``), and here no entry wait tells it either; it
    still enters last more often than any other rank, window after window."""
    ranks = _no_entry_waits(signals(Job(n=8, slow={5}, lag_share=SMALL, late_every=2,
                                        windows=6)))  # fmt: skip
    report = analyse(ranks, job="j")
    assert kinds(report) == [(SLOW_RANK, [5])]
    assert "more often than any other" in report.findings[0].evidence[0]
    quick = _no_entry_waits(signals(Job(n=8, slow={5}, lag_share=0.25, late_every=2)))
    assert analyse(quick, job="j").status == HEALTHY  # two windows ask for more


def test_waiting_least_without_arriving_last_is_not_a_straggler_however_long() -> None:
    ranks = _no_entry_waits(signals(Job(slow={1}, lag_share=SMALL, lag_seen=False, windows=12)))
    assert analyse(ranks, job="j").status == HEALTHY


@pytest.mark.parametrize("seed", range(4))
def test_a_different_small_straggler_every_few_windows_is_healthy(seed: int) -> None:
    """A busy machine: in each window one rank, drawn at random, is descheduled long
    enough to look like a small straggler, up to four windows in a row."""
    rng = random.Random(seed)
    n, count = 4, 24
    chosen: list[int] = []
    for length in (4, 2, 4, 1, 3, 4, 2, 4):
        rank = rng.choice([r for r in range(n) if not chosen or r != chosen[-1]])
        chosen += [rank] * length
    per_window = [signals(Job(n=n, slow={r}, slow_in={i}, lag_share=SMALL, windows=count,
                              seed=seed)) for i, r in enumerate(chosen[:count])]  # fmt: skip
    ranks = [
        RankSignals(rank, "h0", 5.0, tuple(per_window[i][rank].windows[i] for i in range(count)))
        for rank in range(n)
    ]
    assert analyse(ranks, job="j").status == HEALTHY
    # every window has its suspect: four in a row would be enough to name one
    four = SlowOptions(confirm_sustained=4, ongoing=False)
    assert analyse(ranks, job="j", options=four).status != HEALTHY
