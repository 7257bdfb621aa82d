"""Where a rank's failures point: its host, its evidence and every job rank's process.

A value the job hands each communicator it builds (``cclctl.init()``, a shrink), so a
failure state knows at construction how to name an origin's process and where this rank's
dump goes; nothing writes them into it afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RankIdentity:
    """``host``: this rank's hostname; ``evidence``: the folder its dump goes to (empty:
    nowhere); ``peers``: every job rank's (host, pid), by the job's rank."""

    host: str = ""
    evidence: str = ""
    peers: Sequence[tuple[str, int]] = ()


#: a communicator built outside a job (a test's, a probe's): no host, no dump, no peers
UNKNOWN = RankIdentity()
