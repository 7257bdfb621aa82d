"""The slow-job analysis over modelled per-rank windows: each kind at every position, and
the quiet cases (jitter, a busy machine, one long step, a young or idle job)."""

from __future__ import annotations

import json

import pytest
from slow_factory import Job, signals

from cclctl.diagnose.slow import analyse
from cclctl.diagnose.slow_model import (
    HEALTHY,
    SLOW,
    SLOW_HOST,
    SLOW_LINK,
    SLOW_RANK,
    UNJUDGED,
    SlowOptions,
    SlowReport,
)

TWO_HOSTS = ("h1", "h1", "h2", "h2")


def run(job: Job, **options: object) -> SlowReport:
    return analyse(signals(job), job="j", options=SlowOptions(**options))  # type: ignore[arg-type]


def kinds(report: SlowReport) -> list[tuple[str, list[int]]]:
    return [(f.kind, f.ranks) for f in report.findings]


@pytest.mark.parametrize("n", [4, 8])
def test_a_straggler_is_named_at_every_position(n: int) -> None:
    for rank in range(n):
        report = run(Job(n=n, slow={rank}, seed=rank))
        assert report.status == SLOW
        assert kinds(report) == [(SLOW_RANK, [rank])], rank
        finding = report.findings[0]
        assert finding.slowdown == pytest.approx(1 / (1 - 0.25), rel=0.08)
        assert finding.windows == 4
        assert finding.comm == f"0:0-{n - 1}"
        assert "entered last in 100%" in finding.evidence[0]
        assert finding.host == "h0"


def test_a_straggler_the_sampled_entries_miss_is_named_from_the_others_entry_waits() -> None:
    """Sampled seqs that all start together (a step's second call at even seqs) show no
    lag; the others' waits on it before it arrived still do, with no clock."""
    report = run(Job(slow={1}, lag_seen=False))
    assert kinds(report) == [(SLOW_RANK, [1])]
    assert not any("entered last" in line for line in report.findings[0].evidence)
    assert any("blocked on it before it arrived" in line for line in report.findings[0].evidence)


def test_waiting_least_without_arriving_last_is_not_a_straggler() -> None:
    """A rank whose calls are short for another reason (it is a reduce's leaf, say) but
    which nobody waits for, and which enters on time, is not named."""
    job = Job(slow={1}, lag_seen=False)
    ranks = signals(job)
    for rank in ranks:
        for window in rank.windows:
            for peer in window.peers.values():
                peer.entry_wait_ns = 0
    assert analyse(ranks, job="j").status == HEALTHY


def test_the_straggler_has_the_largest_lag_and_the_smallest_wait_share() -> None:
    report = run(Job(slow={2}))
    figures = report.figures
    assert max(figures, key=lambda r: figures[r].entry_lag_s or 0.0) == 2
    assert min(figures, key=lambda r: figures[r].wait_share) == 2
    assert figures[2].entry_lag_s == pytest.approx(0.25 * 5.0 / 200, rel=0.2)


def test_a_straggler_on_another_host_is_named_within_the_skew_tolerance() -> None:
    job = Job(hosts=TWO_HOSTS, slow={3}, skew={"h2": -0.001})
    assert kinds(run(job)) == [(SLOW_RANK, [3])]


def test_a_host_clock_far_ahead_blames_no_rank_of_it() -> None:
    """Entries of h2 look 20 ms late, but its ranks wait as long as the others: no one
    is called a straggler from the clock alone."""
    report = run(Job(hosts=TWO_HOSTS, skew={"h2": 0.02}))
    assert report.status == HEALTHY, kinds(report)


def test_all_ranks_of_a_host_late_is_a_slow_host() -> None:
    report = run(Job(hosts=TWO_HOSTS, slow={2, 3}))
    assert kinds(report) == [(SLOW_HOST, [2, 3])]
    assert report.findings[0].host == "h2"


@pytest.mark.parametrize("via_hosts", [None, ("h1", "h2", "h3", "h4")])
def test_a_slow_link_is_named_with_its_direction_at_every_position(via_hosts: object) -> None:
    for src in range(4):
        dst = (src + 1) % 4
        job = Job(hosts=via_hosts, slow_links={(src, dst)}, coupling=0.3, seed=src)  # type: ignore[arg-type]
        report = run(job)
        assert kinds(report) == [(SLOW_LINK, [src, dst])], (src, kinds(report))
        finding = report.findings[0]
        assert finding.link == (src, dst)
        kind = "shared memory" if via_hosts is None else "TCP across hosts"
        assert kind in finding.summary


def test_a_slow_link_across_two_hosts_names_the_direction() -> None:
    report = run(Job(hosts=TWO_HOSTS, slow_links={(1, 2)}, coupling=0.3))
    assert kinds(report) == [(SLOW_LINK, [1, 2])]


def test_a_slow_link_in_all_to_all_names_the_reverse_as_normal() -> None:
    report = run(Job(pattern="all", slow_links={(2, 0)}))
    assert kinds(report) == [(SLOW_LINK, [2, 0])]
    assert any("reverse direction is normal" in line for line in report.findings[0].evidence)


def test_a_slow_egress_is_a_slow_host_not_its_links() -> None:
    report = run(Job(hosts=("h1", "h1", "h2", "h2", "h3", "h3"), n=6, pattern="all",
                     slow_egress="h1"))  # fmt: skip
    assert [f.kind for f in report.findings] == [SLOW_HOST]
    finding = report.findings[0]
    assert finding.host == "h1" and "egress" in finding.summary
    assert finding.ranks == [0, 1]


def test_a_slow_egress_between_two_hosts_is_a_slow_host() -> None:
    report = run(Job(hosts=TWO_HOSTS, pattern="all", slow_egress="h2"))
    assert [(f.kind, f.host) for f in report.findings] == [(SLOW_HOST, "h2")]


@pytest.mark.parametrize("seed", range(5))
def test_jitter_alone_is_healthy(seed: int) -> None:
    report = run(Job(n=8, seed=seed, jitter_s=0.02, windows=12))
    assert report.status == HEALTHY, kinds(report)
    assert "no rank, link or host" in report.reason


@pytest.mark.parametrize("seed", range(3))
def test_a_busy_machine_is_healthy(seed: int) -> None:
    """Two ranks delayed at random by up to half a period, as two busy loops would."""
    job = Job(seed=seed, noisy={0, 1}, noise_s=0.0125, windows=12, pattern="all")
    report = run(job)
    assert report.status == HEALTHY, kinds(report)


def test_one_long_step_or_pause_is_not_a_finding() -> None:
    for window in range(4):
        report = run(Job(slow={1}, slow_in={window}, lag_share=0.6))
        assert report.status == HEALTHY, (window, kinds(report))
        report = run(Job(slow_links={(1, 2)}, slow_in={window}))
        assert report.status == HEALTHY, (window, kinds(report))


def test_two_windows_in_a_row_confirm() -> None:
    assert kinds(run(Job(slow={1}, slow_in={2, 3}))) == [(SLOW_RANK, [1])]
    assert kinds(run(Job(slow={1}, slow_in={2, 3}), confirm=3)) == []


def test_live_reports_what_is_slow_now_and_post_mortem_what_was() -> None:
    job = Job(slow={1}, slow_in={0, 1})
    assert run(job).status == HEALTHY
    assert kinds(run(job, ongoing=False)) == [(SLOW_RANK, [1])]


def test_below_the_minimum_effect_is_healthy_and_the_minimum_is_configurable() -> None:
    job = Job(slow={3}, lag_share=0.08)  # 1.09x
    assert run(job).status == HEALTHY
    assert kinds(run(job, min_slowdown=1.05)) == [(SLOW_RANK, [3])]


def test_a_young_job_is_not_judged() -> None:
    report = run(Job(windows=1, slow={1}))
    assert report.status == UNJUDGED
    assert report.reason.startswith("too young to judge: 1 window of 5s complete")


def test_an_idle_job_is_not_judged() -> None:
    report = run(Job(calls=2, nbytes=1000, slow={1}))
    assert report.status == UNJUDGED
    assert report.reason.startswith("too idle to judge: 0 of 4 windows")


def test_no_signals_is_not_judged() -> None:
    report = analyse([], job="j")
    assert report.status == UNJUDGED and "no rank publishes signals" in report.reason


def test_the_document_is_versioned_and_plain_json() -> None:
    report = run(Job(hosts=TWO_HOSTS, slow_links={(1, 2)}, coupling=0.3))
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["schema"] == "cclctl.slow" and doc["version"] == 1
    assert doc["status"] == "slow"
    (finding,) = doc["findings"]
    assert finding["kind"] == "slow_link" and finding["link"] == [1, 2]
    assert finding["ranks"] == [1, 2] and finding["slowdown"] > 1.15
    assert finding["evidence"] and finding["next_step"].startswith("measure the link")
    assert set(doc["ranks"]) == {"0", "1", "2", "3"}
    assert analyse(signals(Job(hosts=TWO_HOSTS, slow_links={(1, 2)}, coupling=0.3)),
                   job="j").to_dict() == report.to_dict()  # fmt: skip


@pytest.mark.parametrize("hosts", [None, "each"])
@pytest.mark.parametrize("n", [4, 8])
def test_a_straggler_in_a_tcp_ring_is_the_one_finding_at_every_position(
    n: int, hosts: str | None
) -> None:
    """Over TCP the ranks downstream of a straggler wait on their upstream neighbour in
    the data phase, each as long as that one waited on the straggler: the links out of
    them carry no lost time of their own, and none is named."""
    for rank in range(n):
        on = [f"h{r}" for r in range(n)] if hosts else None
        job = Job(n=n, hosts=on, transport="tcp", slow={rank}, seed=rank)
        report = run(job)
        assert kinds(report) == [(SLOW_RANK, [rank])], (rank, kinds(report))
        assert report.findings[0].comm == f"0:0-{n - 1}"


FOUR_HOSTS = ("h1", "h2", "h3", "h4")


def test_a_slow_link_whose_ends_wait_like_every_other_shows_in_its_transfer_times() -> None:
    """Messages within the socket buffers: no sender blocks, and every receiver of the
    ring waits as long as the next (the slow link holds the whole ring back). Only the
    time its messages take from first byte to last tells the slow direction."""
    alike = Job(hosts=FOUR_HOSTS, slow_links={(1, 2)}, coupling=1.0, send_share=0.0)
    report = run(alike)
    assert kinds(report) == [(SLOW_LINK, [1, 2])]
    assert "first byte to last" in report.findings[0].evidence[1]
    untimed = Job(hosts=FOUR_HOSTS, slow_links={(1, 2)}, coupling=1.0, send_share=0.0,
                  transfer_share=0.0)  # fmt: skip
    assert run(untimed).status == HEALTHY


def test_a_slow_direction_in_all_to_all_by_transfer_times_names_the_reverse_normal() -> None:
    job = Job(hosts=FOUR_HOSTS, pattern="all", slow_links={(3, 1)}, coupling=1.0, send_share=0.0)
    report = run(job)
    assert kinds(report) == [(SLOW_LINK, [3, 1])]
    assert any("reverse direction is normal" in line for line in report.findings[0].evidence)


def test_a_straggler_and_a_slow_link_at_once_are_both_named() -> None:
    """With a straggler found, links are judged by their transfer times, which its
    lateness does not reach: the slow link still shows."""
    job = Job(hosts=FOUR_HOSTS, slow={0}, slow_links={(2, 3)}, coupling=0.3)
    assert sorted(kinds(run(job))) == [(SLOW_LINK, [2, 3]), (SLOW_RANK, [0])]


def test_a_slow_egress_with_a_link_whose_messages_arrived_whole_is_still_a_slow_host() -> None:
    """A link sharing the slow egress whose receiver read another of the host's links
    while its messages came (they were whole in its socket once it looked) is untimed,
    not fast: it does not break the host's finding into links."""
    job = Job(hosts=TWO_HOSTS, pattern="all", slow_egress="h2", untimed={(2, 0)})
    report = run(job)
    assert [(f.kind, f.host) for f in report.findings] == [(SLOW_HOST, "h2")]
    assert "(3, and 1 whose messages arrived whole)" in report.findings[0].summary
