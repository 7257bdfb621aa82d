"""The probe's pure parts: the schedule, the verdicts, the renderings, the document."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from cclctl.errors import BadInput, ConfigError
from cclctl.probe import document, render, schedule
from cclctl.probe.model import OK, SHM, TCP, UNREACHABLE, Link, ProbeRun
from cclctl.probe.options import ProbeOptions
from cclctl.probe.verdict import SLOW_HOST, SLOW_LINK, UNREACHABLE_KIND, Bounds, judge


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 9])
def test_the_circle_meets_every_pair_once_each_member_once_a_round(n: int) -> None:
    rounds = schedule.circle(list(range(n)))
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    met = [pair for round_ in rounds for pair in round_]
    assert sorted(met) == list(itertools.combinations(range(n), 2))
    for round_ in rounds:
        members = [m for pair in round_ for m in pair]
        assert len(members) == len(set(members))
        assert len(round_) == n // 2  # every member busy, but the bye of an odd count


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_a_ring_meets_each_neighbour_in_two_or_three_rounds(n: int) -> None:
    rounds = schedule.ring(list(range(n)))
    assert len(rounds) == (1 if n == 2 else 2 if n % 2 == 0 else 3)
    met = sorted(p for r in rounds for p in r)
    assert met == sorted({(min(i, (i + 1) % n), max(i, (i + 1) % n)) for i in range(n)})
    for round_ in rounds:
        members = [m for pair in round_ for m in pair]
        assert len(members) == len(set(members))


def test_a_sample_is_a_few_rounds_of_distinct_random_partners() -> None:
    rounds = schedule.sample(list(range(16)), 3, seed=7)
    met = [p for r in rounds for p in r]
    assert len(rounds) == 3 and len(met) == len(set(met)) == 24
    assert rounds == schedule.sample(list(range(16)), 3, seed=7)
    assert rounds != schedule.sample(list(range(16)), 3, seed=8)
    assert schedule.partner(rounds[0], rounds[0][0][1]) == rounds[0][0][0]
    with pytest.raises(ConfigError):
        schedule.build([0, 1], "star")


def _run(
    bw: dict[tuple[int, int], float],
    hosts: tuple[str, ...],
    kind: str = TCP,
    direction: str = "each",
    status: dict[tuple[int, int], str] | None = None,
) -> ProbeRun:
    status = status or {}
    links = tuple(
        Link(
            s,
            d,
            kind,
            status.get((s, d), OK),
            None if status.get((s, d)) else bw.get((s, d), 1e9),
            1e-5,
            5,
            "timed out" if status.get((s, d)) else "",
        )
        for s in range(len(hosts))
        for d in range(len(hosts))
        if s != d
    )
    return ProbeRun(len(hosts), hosts, tuple(range(len(hosts))), "tcp", "all", direction,
                    len(hosts) - 1, (0.1,) * (len(hosts) - 1), links)  # fmt: skip


HOSTS4 = ("h0", "h1", "h2", "h3")


def test_one_slow_directed_link_is_flagged_with_its_direction() -> None:
    run = _run({(1, 2): 23e6}, HOSTS4)
    verdict = judge(run)
    assert verdict.flagged == {(1, 2)}
    [finding] = verdict.findings
    assert finding.kind == SLOW_LINK and (finding.src, finding.dst) == (1, 2)
    assert finding.text == (
        "rank 1 -> rank 2 (h1 -> h2): 23.0 MB/s, 0.02× the median of 12 TCP links; "
        "reverse direction normal"
    )


def test_a_host_slow_with_every_partner_is_named_as_the_host() -> None:
    run = _run({(3, d): 20e6 for d in range(3)}, HOSTS4)
    verdict = judge(run)
    assert verdict.flagged == {(3, 0), (3, 1), (3, 2)}
    [finding] = verdict.findings
    assert (finding.kind, finding.host, finding.direction) == (SLOW_HOST, "h3", "egress")


def test_with_two_hosts_a_slow_link_is_not_called_a_host() -> None:
    run = _run({(0, 1): 1e6}, ("a", "b"))
    verdict = judge(run, Bounds(min_bw=0.5e9))
    assert [f.kind for f in verdict.findings] == [SLOW_LINK]


def test_a_healthy_spread_is_quiet_and_half_speed_is_not_flagged() -> None:
    bw = {(s, d): 1e9 * (0.6 + 0.1 * ((s * 5 + d) % 5)) for s in range(4) for d in range(4)}
    bw[(0, 1)] = 0.5e9
    assert judge(_run(bw, HOSTS4)).ok


def test_an_unreachable_pair_is_one_finding_and_not_a_slow_link() -> None:
    run = _run({}, HOSTS4, status={(2, 3): UNREACHABLE, (3, 2): UNREACHABLE})
    verdict = judge(run)
    [finding] = verdict.findings
    assert finding.kind == UNREACHABLE_KIND and (finding.src, finding.dst) == (2, 3)
    assert finding.text == "rank 2 <-> rank 3 (h2 <-> h3): unreachable: timed out"


def test_the_floor_and_the_baseline_must_agree_with_the_relative_bound() -> None:
    run = _run({(1, 2): 23e6}, HOSTS4)
    assert judge(run, Bounds(min_bw=10e6)).ok  # above the floor: not flagged
    assert judge(run, Bounds(min_bw=50e6)).flagged == {(1, 2)}
    assert judge(run, Bounds(baseline={TCP: 20e6})).ok
    assert judge(run, Bounds(baseline={TCP: 1e9})).flagged == {(1, 2)}


def test_two_links_and_no_floor_are_not_judged_and_say_so() -> None:
    run = _run({(0, 1): 1e6}, ("a", "b"))
    verdict = judge(run)
    assert verdict.ok and verdict.unjudged == (TCP,)
    assert "no bound applies to tcp links" in render.report(run, verdict)


def test_both_directions_at_once_do_not_claim_a_direction() -> None:
    verdict = judge(_run({(1, 2): 23e6}, HOSTS4, direction="both"))
    assert "rerun with --direction each" in verdict.findings[0].text


def test_the_matrix_fits_80_columns_up_to_8_ranks_then_lists() -> None:
    run8 = _run({(1, 2): 23e6}, tuple(f"node{r}" for r in range(8)), kind=SHM)
    text = render.report(run8, judge(run8))
    assert max(len(line) for line in text.splitlines() if ":" not in line[8:]) <= 80
    assert max(len(line) for line in text.splitlines()[:12]) <= 80  # headline and matrix
    assert "0.023*" in text and "src\\dst" in text
    run9 = _run({(1, 2): 23e6}, tuple(f"n{r}" for r in range(9)), kind=SHM)
    text9 = render.report(run9, judge(run9))
    assert "src\\dst" not in text9 and "1 -> 2" in text9


def test_the_document_round_trips_and_serves_as_a_baseline() -> None:
    run = _run({(1, 2): 23e6}, HOSTS4)
    verdict = judge(run)
    doc = json.loads(document.dumps(run, verdict))
    assert doc["schema"] == "cclctl.probe" and doc["version"] == 1 and doc["ok"] is False
    link = next(x for x in doc["links"] if (x["src"], x["dst"]) == (1, 2))
    assert link["flagged"] is True and link["bandwidth"] == 23e6 and link["latency"] == 1e-5
    assert doc["findings"][0]["kind"] == "slow_link"
    assert document.baseline(json.dumps(doc), "x") == {TCP: 1e9}  # the flagged link left out
    assert ProbeRun.from_dict(doc).links == run.links
    for bad in ("{", '{"schema": "other"}', '{"schema": "cclctl.probe", "version": 1}'):
        with pytest.raises(BadInput):
            document.baseline(bad, "x")


def test_options_refuse_bad_values() -> None:
    for bad in ({"direction": "up"}, {"pairs": "star"}, {"small": 4}, {"iters": 0},
                {"large": 4, "small": 8}, {"timeout_s": 0}):  # fmt: skip
        with pytest.raises(ConfigError):
            ProbeOptions(**bad)
    opts = ProbeOptions(pairs="sample", rounds=2)
    assert ProbeOptions.from_json(opts.to_json()) == opts


@pytest.mark.parametrize(
    "args",
    [["--direction", "up"], ["--pairs", "star"], ["-e", "lots"], ["--k", "0"],
     ["--baseline", "/nonexistent/probe.json"], ["-g", "1"]],
)  # fmt: skip
def test_bad_usage_is_one_line_and_exit_2(args: list[str]) -> None:
    out = subprocess.run([sys.executable, "-m", "cclctl", "probe", *args],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
