"""Rank 0's recheck rounds: a pair slow at one look is measured again, up to RECHECKS times
while it stays slow, fewest looks first; a pair that recovers is not measured again."""

from __future__ import annotations

from typing import Any

from cclctl.probe.model import Link
from cclctl.probe.rounds import RECHECKS, Scorer

FAST = 1e9


def scorer_with(bandwidths: dict[tuple[int, int], float]) -> Scorer:
    scorer = Scorer(place=None, rounds=[])  # type: ignore[arg-type]  # rounds need no place
    for (src, dst), bw in bandwidths.items():
        scorer.take(_report(src, dst, bw))
    return scorer


def _report(src: int, dst: int, bw: float) -> dict[str, Any]:
    return Link(src, dst, "shm", bandwidth=bw, latency=1e-6, repeats=8).to_dict()


def healthy(world: int) -> dict[tuple[int, int], float]:
    return {(a, b): FAST for a in range(world) for b in range(world) if a != b}


def test_a_pair_slow_at_every_look_is_measured_recheck_times_then_left() -> None:
    scorer = scorer_with(healthy(4) | {(1, 2): FAST / 10})
    rounds = []
    while (round_ := scorer.next_recheck()) is not None:
        rounds.append(round_)
        scorer.take(_report(1, 2, FAST / 10), again=True)  # still slow
        assert len(rounds) <= RECHECKS
    assert rounds == [[(1, 2)]] * RECHECKS


def test_a_pair_that_recovers_at_a_recheck_is_not_measured_again() -> None:
    scorer = scorer_with(healthy(4) | {(2, 1): FAST / 10})
    assert scorer.next_recheck() == [(1, 2)]
    scorer.take(_report(2, 1, FAST * 0.9), again=True)
    assert scorer.next_recheck() is None
    assert scorer.links[(2, 1)].bandwidth == FAST * 0.9


def test_rechecks_run_disjoint_pairs_fewest_looks_first_and_skip_stopped_ranks() -> None:
    slow = {(0, 1): FAST / 10, (1, 2): FAST / 10, (2, 3): FAST / 10, (4, 5): FAST / 10}
    scorer = scorer_with(healthy(6) | slow)
    scorer.stopped[4] = "gone"
    first = scorer.next_recheck()
    assert first == [(0, 1), (2, 3)]  # (1, 2) shares a rank with both; (4, 5) lost rank 4
    second = scorer.next_recheck()
    assert second == [(1, 2)]  # the pair with no look yet goes before any second look
    assert scorer.next_recheck() == [(0, 1), (2, 3)]


def test_a_worse_figure_at_a_recheck_does_not_replace_a_better_one() -> None:
    scorer = scorer_with(healthy(3) | {(0, 1): FAST / 10})
    scorer.take(_report(0, 1, FAST / 100), again=True)
    assert scorer.links[(0, 1)].bandwidth == FAST / 10
