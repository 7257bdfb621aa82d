"""``top``'s line about the job's last probe: when it ran and what it found, in 80 columns.

``probe 12s ago: 56 links ok`` when every link passed; otherwise its findings, shortest
words first within each kind (``host h3 egress slow``, ``1->2 slow (h1->h2)``, ``2<->3
unreachable``), as many as fit, then ``+N more``. The whole story is ``cclctl probe``'s own
output, or ``cclctl diagnose slow --store``'s evidence.
"""

from __future__ import annotations

from cclctl.diagnose.slow_probe import age_words
from cclctl.probe_record import ProbeFinding, ProbeRecord

WIDTH = 80


def probe_line(record: ProbeRecord, now_ns: int, width: int = WIDTH) -> str:
    """One line of at most ``width`` characters."""
    age = (now_ns - record.time_ns) / 1e9 if record.time_ns and now_ns >= record.time_ns else None
    head = f"probe {age_words(age)}: "
    if record.ok:
        return _clip(f"{head}{record.links_total} links ok", width)
    order = {"slow_host": 0, "unreachable": 1, "slow_link": 2}
    words = [_words(f, record) for f in sorted(record.findings, key=lambda f: order.get(f.kind, 3))]
    shown: list[str] = []
    for i, word in enumerate(words):
        rest = len(words) - i - 1
        tail = f"; +{rest} more" if rest else ""
        candidate = head + "; ".join([*shown, word]) + tail
        if len(candidate) > width and shown:
            break
        shown.append(word)
    more = len(words) - len(shown)
    return _clip(head + "; ".join(shown) + (f"; +{more} more" if more else ""), width)


def unreadable_line(why: str, width: int = WIDTH) -> str:
    """The line when the job's probe document cannot be used (the statuses still are)."""
    return _clip(f"probe: unreadable ({why})", width)


def _words(finding: ProbeFinding, record: ProbeRecord) -> str:
    src, dst = finding.src, finding.dst
    if finding.kind == "slow_host":
        return f"host {finding.host} {finding.direction or ''} slow".replace("  ", " ")
    if src is None or dst is None:
        return finding.kind.replace("_", " ")
    if finding.kind == "unreachable":
        return f"{src}<->{dst} unreachable"
    hosts = f" ({record.host(src)}->{record.host(dst)})"
    return f"{src}->{dst} slow" + (hosts if record.host(src) != record.host(dst) else "")


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
