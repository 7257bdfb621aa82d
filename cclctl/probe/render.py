"""The probe for people: a ranks x ranks bandwidth matrix (flagged cells marked) that fits
80 columns up to :data:`MATRIX_MAX` ranks, a list of the flagged links beyond, and one line
per finding in words.
"""

from __future__ import annotations

from cclctl.probe.model import OK, ProbeRun
from cclctl.probe.units import format_bw, format_latency
from cclctl.probe.verdict import Verdict

MATRIX_MAX = 8
_CELL = 8  # characters per column: "12.3G*" fits with room


def report(run: ProbeRun, verdict: Verdict) -> str:
    """The whole text: what ran, the matrix (or the flagged list), the medians, the findings."""
    lines = _headline(run)
    if len(run.participants) <= MATRIX_MAX:
        lines += matrix(run, verdict)
    else:
        lines += flagged_list(run, verdict)
    lines += _medians(verdict)
    lines.append("")
    if verdict.findings:
        lines += [f"{f.kind}: {f.text}" for f in verdict.findings]
    else:
        lines.append(f"all {sum(1 for x in run.links if x.status == OK)} links pass")
    lines += [
        f"note: no bound applies to {kind} links (fewer than 3 to compare, no --min-bw, no "
        "--baseline): they were not judged"
        for kind in verdict.unjudged
    ]
    return "\n".join(lines)


def _headline(run: ProbeRun) -> list[str]:
    per_round = sum(run.round_s) / len(run.round_s) if run.round_s else 0.0
    hosts = len(set(run.hosts[r] for r in run.participants))
    return [
        f"probe: {len(run.participants)} ranks on {hosts} host(s), {run.transport}, "
        f"pairs {run.pairs}, direction {run.direction}",
        f"schedule: {run.rounds} rounds, {per_round:.2f} s per round, "
        f"{sum(run.round_s):.2f} s in all"
        + (
            f"; {len(run.recheck_s)} recheck round(s), {sum(run.recheck_s):.2f} s"
            if run.recheck_s
            else ""
        ),
    ]


def matrix(run: ProbeRun, verdict: Verdict) -> list[str]:
    """Rows send, columns receive; each cell the link's bandwidth in GB/s, ``*`` flagged,
    ``x`` unreachable, ``.`` not measured, ``-`` the rank itself."""
    ranks = list(run.participants)
    out = [
        "bandwidth GB/s (row sends to column; * flagged, x unreachable, . not measured)",
        "src\\dst" + "".join(f"{r:>{_CELL}}" for r in ranks),
    ]
    for src in ranks:
        cells = []
        for dst in ranks:
            cells.append(f"{_cell(run, verdict, src, dst):>{_CELL}}")
        out.append(f"{src:>7}" + "".join(cells))
    return out


def _cell(run: ProbeRun, verdict: Verdict, src: int, dst: int) -> str:
    if src == dst:
        return "- "
    link = run.link(src, dst)
    if link is None:
        return ". "
    if link.status != OK or link.bandwidth is None:
        return "x "
    mark = "*" if (src, dst) in verdict.flagged else " "
    gb = link.bandwidth / 1e9
    text = f"{gb:.3f}" if gb < 1 else f"{gb:.2f}" if gb < 10 else f"{gb:.1f}"
    return text + mark


def flagged_list(run: ProbeRun, verdict: Verdict) -> list[str]:
    """Beyond the matrix's width: the flagged and unreachable links, one a line."""
    bad = [x for x in run.links if (x.src, x.dst) in verdict.flagged or x.status != OK]
    out = [f"{len(run.links)} directed links measured; {len(bad)} flagged or unreachable:"]
    for link in sorted(bad, key=lambda x: (x.src, x.dst)):
        what = format_bw(link.bandwidth) if link.bandwidth is not None else link.status
        lat = f", {format_latency(link.latency)}" if link.latency is not None else ""
        out.append(
            f"  {link.src:>5} -> {link.dst:<5} {run.host(link.src)} -> {run.host(link.dst)}: "
            f"{what}{lat}"
        )
    return out


def _medians(verdict: Verdict) -> list[str]:
    return [
        f"{s.kind}: median {format_bw(s.median)} over {s.count} links"
        + (f", flagged below {format_bw(s.bound)}" if s.bound is not None else "")
        for s in verdict.stats.values()
    ]
