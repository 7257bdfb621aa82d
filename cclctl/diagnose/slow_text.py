"""Confirmed suspects worded as findings: the summary, the evidence and what to do.

Figures over a run of windows are medians (one odd window does not set them), and a slow
host's finding takes the place of its ranks' and links' own, since it explains them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cclctl.diagnose.slow_links import SlowEdge, SlowLink
from cclctl.diagnose.slow_model import (
    SLOW_HOST,
    SLOW_LINK,
    SLOW_RANK,
    SlowFinding,
    SlowOptions,
    SlowReport,
)
from cclctl.diagnose.slow_ranks import Straggle
from cclctl.diagnose.slow_stats import median
from cclctl.ranges import fold_ranks

#: The share of a window a slowdown estimate may reach (1/(1-0.95) = 20x at most).
MAX_COST = 0.95


def slowdown(costs: Sequence[float]) -> float:
    """The estimated job slowdown from the share of each window the suspect cost."""
    return 1.0 / (1.0 - min(MAX_COST, max(0.0, median(costs))))


def findings(
    runs: Mapping[tuple[str, Any], list[Any]],
    hosts: Mapping[int, str],
    pids: Mapping[int, int],
    window_s: float,
    opts: SlowOptions,
) -> list[SlowFinding]:
    """Findings for the confirmed runs, the costliest first."""
    out: list[SlowFinding] = []
    slow_hosts = {key[1] for key in runs if key[0] in ("host", "egress", "ingress")}
    for (kind, what), run in sorted(runs.items(), key=lambda kv: str(kv[0])):
        confirmed = f"found in {len(run)} consecutive windows of {window_s:g}s"
        if kind in ("rank", "host"):
            confirmed += _sustained(run, opts)
        if kind == "rank" and hosts.get(what[0]) not in slow_hosts:
            out.append(_rank(run, hosts, pids, confirmed))
        elif kind == "host":
            out.append(_host_ranks(str(what), run, confirmed))
        elif kind == "link" and not _on_slow_host(what, hosts, slow_hosts):
            out.append(_link(run, hosts, confirmed))
        elif kind in ("egress", "ingress"):
            out.append(_host_links(str(what), kind, run, hosts, confirmed))
    return sorted(out, key=lambda f: (-f.slowdown, f.kind, f.ranks))


def _sustained(run: Sequence[Straggle], opts: SlowOptions) -> str:
    """Words for a straggler confirmed by its long run alone (see ``SlowOptions``)."""
    if all(s.costly for s in run[-opts.confirm :]):
        return ""
    return (
        f": under the {opts.min_slowdown:g}x that {opts.confirm} windows confirm, a finding "
        f"from {opts.sustained_slowdown:g}x once it holds "
        f"{max(opts.confirm, opts.confirm_sustained)} windows in a row"
    )


def _on_slow_host(pair: tuple[int, int], hosts: Mapping[int, str], slow: set[Any]) -> bool:
    return hosts.get(pair[0]) in slow or hosts.get(pair[1]) in slow


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.1f} ms"


def _pct(share: float) -> str:
    return f"{share * 100:.0f}%"


def _rate(bytes_per_s: float) -> str:
    if bytes_per_s >= 1e10:  # held under MIN_WAIT_S: too fast to time
        return "over 10 GB/s"
    if bytes_per_s >= 1e9:
        return f"{bytes_per_s / 1e9:.2f} GB/s"
    return f"{bytes_per_s / 1e6:.1f} MB/s"


def _arrival(run: Sequence[Straggle]) -> list[str]:
    new = run[-1]
    lines = []
    last = sum(s.entered_last for s in run) * 2 > len(run)
    if last or sum(s.last_most for s in run) * 2 > len(run):
        lines.append(
            f"entered last in {_pct(median(s.last_frac for s in run))} of the {new.seqs} "
            f"sampled calls of comm {new.comm} per window"
            f"{'' if last else ', more often than any other'}, "
            f"{_ms(median(s.lag_s for s in run))} after the others' median entry"
        )
    lines += [
        f"spent {_pct(median(s.share for s in run))} of each window inside collectives against "
        f"{_pct(median(s.others_share for s in run))} for the others: they wait for it",
    ]
    waited = median(s.entry_wait_share for s in run)
    if waited > 0:
        lines.append(
            f"the others blocked on it before it arrived in their calls for {_pct(waited)} of "
            "a window, together"
        )
    return lines


def _rank(run: Sequence[Straggle], hosts: Mapping[int, str], pids: Mapping[int, int],
          confirmed: str) -> SlowFinding:  # fmt: skip
    rank = run[-1].ranks[0]
    est = slowdown([s.cost for s in run])
    where = ", ".join(x for x in (f"pid {pids.get(rank)}" if pids.get(rank) else "",
                                  f"on {hosts[rank]}" if hosts.get(rank) else "") if x)  # fmt: skip
    return SlowFinding(
        SLOW_RANK,
        f"rank {rank} is a straggler: it enters its collectives last and waits least "
        f"(est. job slowdown {est:.2f}x)",
        [rank],
        est,
        [*_arrival(run), confirmed],
        f"look at what rank {rank}{f' ({where})' if where else ''} does between collectives: "
        "CPU quota or contention, data loading, a larger batch; `py-spy dump --pid` shows where "
        "it is. If its machine is at fault, drain the host.",
        len(run),
        host=hosts.get(rank) or None,
        comm=run[-1].comm,
    )


def _host_ranks(host: str, run: Sequence[Straggle], confirmed: str) -> SlowFinding:
    ranks = list(run[-1].ranks)
    est = slowdown([s.cost for s in run])
    return SlowFinding(
        SLOW_HOST,
        f"host {host} is slow: all its ranks ({fold_ranks(ranks)}) enter their collectives "
        f"last and wait least (est. job slowdown {est:.2f}x)",
        ranks,
        est,
        [*_arrival(run), confirmed],
        f"drain host {host} (the machine, not one rank: CPU, memory, thermal throttling) and "
        "check it before it rejoins",
        len(run),
        host=host,
        comm=run[-1].comm,
    )


def _link_words(slow: SlowLink, hosts: Mapping[int, str]) -> str:
    link = slow.link
    src, dst = hosts.get(link.src, "?"), hosts.get(link.dst, "?")
    return f"rank {link.src} -> rank {link.dst} ({src} -> {dst}, {link.kind})"


def _link(run: Sequence[SlowLink], hosts: Mapping[int, str], confirmed: str) -> SlowFinding:
    new = run[-1]
    est = slowdown([s.cost for s in run])
    rate = median(s.link.throughput for s in run)
    ref = median(s.reference for s in run)
    share = _pct(median(s.link.wait_s / s.link.span_s for s in run))
    if new.link.transfer_s >= new.link.wait_s:
        held = f"its messages took {share} of each window to arrive, first byte to last"
    else:
        held = f"its two ends blocked on each other {share} of each window"
    evidence = [
        f"{_rate(rate)} against a median of {_rate(ref)} for the other {new.link.kind} links "
        "(bytes over the time the link held them: over TCP its messages' first-to-last-byte "
        "time, else its ends' waits on each other beyond the sender's own waits on others)",
        f"{held}, {new.link.nbytes / 1e6:.1f} MB moved in the newest",
    ]
    if new.reverse is not None:
        state = "slow too" if new.reverse_slow else "normal"
        evidence.append(f"the reverse direction is {state} ({_rate(new.reverse.throughput)})")
    src, dst = hosts.get(new.link.src, "?"), hosts.get(new.link.dst, "?")
    return SlowFinding(
        SLOW_LINK,
        f"link {_link_words(new, hosts)} is slow: {_rate(rate)} against {_rate(ref)} "
        f"(est. job slowdown {est:.2f}x)",
        [new.link.src, new.link.dst],
        est,
        [*evidence, confirmed],
        f"measure the link alone: `cclctl bench` with one rank on {src} and one on {dst}; "
        f"check {src}'s interface toward {dst} (`ip -s link`, `tc -s qdisc`, errors, speed)",
        len(run),
        link=(new.link.src, new.link.dst),
    )


def _edge_count(edge: SlowEdge) -> str:
    """``4``, or ``3, and 1 whose messages arrived whole``."""
    if not edge.untimed:
        return str(len(edge.links))
    return f"{len(edge.links)}, and {edge.untimed} whose messages arrived whole"


def _host_links(host: str, kind: str, run: Sequence[SlowEdge], hosts: Mapping[int, str],
                confirmed: str) -> SlowFinding:  # fmt: skip
    new = run[-1]
    est = slowdown([e.cost for e in run])
    way = "out of" if kind == "egress" else "into"
    ranks = sorted({r for s in new.links for r in (s.link.src, s.link.dst)
                    if hosts.get(r) == host})  # fmt: skip
    evidence = [
        f"{_link_words(s, hosts)}: {_rate(s.link.throughput)} against {_rate(s.reference)}"
        for s in new.links[:8]
    ]
    return SlowFinding(
        SLOW_HOST,
        f"host {host}'s {kind} is slow: every link {way} it ({_edge_count(new)}) is below the "
        f"other hosts' links (est. job slowdown {est:.2f}x)",
        ranks,
        est,
        [*evidence, confirmed],
        f"drain host {host} or check its NIC ({kind}): `ip -s link`, `tc -s qdisc`, "
        f"`ethtool`; then `cclctl bench` between {host} and another host",
        len(run),
        host=host,
    )


def reason(report: SlowReport, hosts: int) -> str:
    """The verdict's one line of why."""
    judged = f"{report.windows_judged} windows of {report.window_s:g}s"
    if report.findings:
        return f"{len(report.findings)} confirmed over {judged} of {report.ranks_seen} ranks"
    opts = report.options
    sustained = ""
    if opts.sustained_share < opts.min_share:
        sustained = (f", nor a rank or host {_pct(opts.sustained_share)} in "
                     f"{max(opts.confirm, opts.confirm_sustained)}")  # fmt: skip
    return (
        f"{judged} of {report.ranks_seen} ranks on {hosts} host{'s' if hosts != 1 else ''} "
        f"judged: no rank, link or host costs the job {_pct(opts.min_share)} of its "
        f"time or more in {opts.confirm} consecutive windows{sustained}"
    )
