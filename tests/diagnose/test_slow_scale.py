"""The slow analysis' one-pass helpers against the plain definitions they replace: the
same numbers and the same suspects for the same windows, on random jobs (ties, hosts of
several ranks, a late unit, skew), so a job of thousands of ranks gets the verdict a
small one would."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from cclctl.diagnose import slow, slow_links, slow_ranks
from cclctl.diagnose.slow_links import TCP_LOCAL, TCP_REMOTE, Link
from cclctl.diagnose.slow_model import SlowOptions
from cclctl.diagnose.slow_ranks import CommView
from cclctl.diagnose.slow_stats import median, sorted_median

OPTS = SlowOptions()
SKEW = int(OPTS.skew_s * 1e9)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 11])
def test_median_is_statistics_median(n: int) -> None:
    rng = random.Random(n)
    for values in ([rng.randrange(10**18) for _ in range(n)], [rng.random() for _ in range(n)]):
        got = median(iter(values))
        assert got == float(statistics.median(values))
        assert type(got) is float
    assert median([]) == 0.0


@pytest.mark.parametrize("n", [0, 1, 2, 7, 8])
def test_sorted_median_is_the_median_of_the_tail(n: int) -> None:
    ordered = sorted(random.Random(n).random() for _ in range(n))
    for start in range(n + 2):
        assert sorted_median(ordered, start) == median(ordered[start:])


def _view(rng: random.Random, ranks: int, seqs: int, late: int | None) -> CommView:
    """Entries near one time per seq (ties by a coarse grid), ``late`` entering later."""
    entries = {}
    for rank in range(ranks):
        lag = 5 * SKEW if rank == late else 0
        entries[rank] = {
            seq: 10**18 + seq * 10**8 + rng.randrange(4) * SKEW // 2 + lag for seq in range(seqs)
        }
    shares = {r: 0.5 for r in entries}
    return CommView("c", shares, entries, 5.0)


def _units(ranks: int, per_host: int, hosts: dict[int, str]) -> list[tuple[int, ...]]:
    """Single ranks and whole hosts mixed, and one unit spread over two hosts."""
    units: list[tuple[int, ...]] = []
    for first in range(0, ranks, per_host):
        group = tuple(range(first, min(ranks, first + per_host)))
        units += [group] if first % (2 * per_host) else [(r,) for r in group]
    if ranks > per_host:  # one unit across two hosts
        a, b = units.pop(0), units.pop(-1)
        units.append(a + b)
    assert sorted(r for u in units for r in u) == list(range(ranks))
    assert all(hosts[u[0]] for u in units)
    return units


def _old_last_counts(view: CommView, units, hosts) -> dict[tuple[int, ...], int]:
    places = {u: {hosts.get(r, "") for r in u} for u in units}
    counts = dict.fromkeys(units, 0)
    for seq in sorted(next(iter(view.entries.values()))):
        times = {u: median(view.entries[r][seq] for r in u) for u in units}
        late = max(units, key=lambda u: times[u])
        if all(times[late] > times[v] + (0 if places[v] == places[late] and len(places[v]) == 1
                                         else SKEW)
               for v in units if v != late):  # fmt: skip
            counts[late] += 1
    return counts


def _old_arrival(view: CommView, unit, others, hosts) -> tuple[float, float]:
    seqs = sorted(next(iter(view.entries.values())))
    unit_hosts = {hosts.get(r, "") for r in unit}
    margins = [0 if {hosts.get(r, "") for r in v} == unit_hosts == {hosts.get(unit[0], "")}
               else SKEW for v in others]  # fmt: skip
    last, lags = 0, []
    for seq in seqs:
        mine = median(view.entries[r][seq] for r in unit)
        theirs = [median(view.entries[r][seq] for r in v) for v in others]
        if all(mine > t + m for t, m in zip(theirs, margins, strict=True)):
            last += 1
        lags.append((mine - median(theirs)) / 1e9)
    return last / len(seqs), median(lags)


@pytest.mark.parametrize("seed", range(12))
def test_unit_times_last_counts_and_arrival_match_their_definitions(seed: int) -> None:
    rng = random.Random(seed)
    ranks, per_host = rng.choice([(6, 2), (16, 4), (40, 8), (9, 1)])
    hosts = {r: f"h{r // per_host}" for r in range(ranks)}
    view = _view(rng, ranks, rng.randrange(1, 9), rng.choice([None, rng.randrange(ranks)]))
    singles = [(r,) for r in range(ranks)]
    for units in (singles, _units(ranks, per_host, hosts)):
        times = slow_ranks.unit_times(view, units)
        seqs = sorted(view.entries[0])
        for unit in units:
            assert times[unit] == [median(view.entries[r][s] for r in unit) for s in seqs]
        expected = _old_last_counts(view, units, hosts)
        assert slow_ranks.last_counts(view, units, hosts, OPTS) == expected
        assert slow_ranks.last_counts(view, units, hosts, OPTS, times) == expected
        for unit in units:
            others = [u for u in units if u != unit]
            got = slow_ranks._arrival(times, unit, others, hosts, OPTS)
            assert got == _old_arrival(view, unit, others, hosts)


def test_rank_lags_are_each_ranks_median_lag_behind_the_median_entry() -> None:
    view = _view(random.Random(3), 9, 5, late=4)
    lags = slow.rank_lags(view)
    for rank, times in view.entries.items():
        mine = [(times[s] - median(t[s] for t in view.entries.values())) / 1e9 for s in times]
        assert lags[rank] == median(mine)
    assert max(lags, key=lags.__getitem__) == 4


def _old_slow_edges(found, hosts, opts):
    """``slow_edges`` as first written: every remote link, per host and direction."""
    remote = [x for x in found if x.kind == TCP_REMOTE]
    logs = sorted(math.log2(x.throughput) for x in remote)
    least = math.log2(opts.link_ratio)
    out = []
    ends = {hosts.get(x.src, "") for x in remote} | {hosts.get(x.dst, "") for x in remote}
    for host in sorted(ends):
        for direction, end in (("out", "src"), ("in", "dst")):
            mine = [x for x in remote if hosts.get(getattr(x, end), "") == host]
            rest = [x for x in remote if x not in mine]
            bound = median(logs[len(mine) :]) if len(logs) > len(mine) else float("-inf")
            judged = [(x, slow_links._judge(x, rest, opts, effect=False)
                       if bound - math.log2(x.throughput) > least else None)
                      for x in mine]  # fmt: skip
            slow = tuple(slow_links.SlowLink(x, ref, None) for x, ref in judged if ref is not None)
            untimed = [x for x, ref in judged if ref is None and x.transfer_s == 0]
            if len({(s.link.src, s.link.dst) for s in slow}) < 2:
                continue
            if len(slow) + len(untimed) == len(judged):
                edge = slow_links.SlowEdge(host, direction, slow, len(untimed))
                if edge.cost >= opts.min_share:
                    out.append(edge)
    return slow_links._egress_first(out)


@pytest.mark.parametrize("seed", range(10))
def test_slow_edges_by_host_match_the_definition(seed: int) -> None:
    """Hosts with slow egress or ingress (some links untimed), among hosts with none."""
    rng = random.Random(seed)
    per_host, n_hosts = rng.choice([1, 2, 4]), rng.randrange(3, 9)
    hosts = {r: f"h{r // per_host}" for r in range(per_host * n_hosts)}
    slow_out, slow_in = rng.randrange(n_hosts), rng.randrange(n_hosts)
    found = []
    for src in hosts:
        for dst in rng.sample(sorted(hosts), k=min(len(hosts), 4)):
            if dst == src:
                continue
            kind = TCP_LOCAL if hosts[src] == hosts[dst] else TCP_REMOTE
            wait = 0.01 * rng.uniform(0.9, 1.1)
            if hosts[src] == f"h{slow_out}" or (hosts[dst] == f"h{slow_in}" and seed % 2):
                wait *= 8
            untimed = rng.random() < 0.2
            found.append(Link(src, dst, kind, 10 << 20, wait, 1.0, 0.0 if untimed else wait))
    expected = _old_slow_edges(found, hosts, OPTS)
    assert slow_links.slow_edges(found, hosts, OPTS) == expected
    if seed == 0:
        assert expected, "the planted host is found"
