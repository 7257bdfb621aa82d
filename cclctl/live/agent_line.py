"""``top``'s line about host agents that stopped writing: whose statuses now come directly.

A host agent writes its host's document every status interval; one whose document is more
than :data:`SILENT_INTERVALS` intervals old while some of its ranks' statuses come from their
own keys (newer) has gone, and its ranks went on without it: ``host agent of h1 silent
since 12s ago: ranks 0-3 publish their own statuses``. A host document that cannot be read
is said too. Nothing while every agent writes.
"""

from __future__ import annotations

from cclctl.diagnose.slow_probe import age_words
from cclctl.live.snapshot import JobStatuses
from cclctl.ranges import fold_ranks

#: a document this many intervals old is an agent that stopped writing
SILENT_INTERVALS = 3.0
WIDTH = 80


def agent_lines(statuses: JobStatuses, width: int = WIDTH) -> list[str]:
    """One line per host whose agent went silent or whose document is unreadable."""
    lines = []
    now = statuses.fetched_ns
    for host, doc in sorted(statuses.hosts.items()):
        age = (now - doc.time_ns) / 1e9
        moved = sorted(r for r in doc.ranks if r in statuses.statuses
                       and r not in statuses.via_agent)  # fmt: skip
        if age > SILENT_INTERVALS * doc.interval_s and moved:
            words = f"ranks {fold_ranks(moved)} publish their own statuses"
            lines.append(
                _clip(f"host agent of {host} silent since {age_words(age)}: {words}", width)
            )
    for host, why in sorted(statuses.bad_hosts.items()):
        lines.append(_clip(f"host agent of {host}: {why}", width))
    return lines


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
