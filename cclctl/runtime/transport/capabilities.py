"""What a transport offers beyond point-to-point steps: the engines selection may choose.

Selection (``runtime/comm/selection.py``) reads a transport's :class:`Capabilities` once per
communicator and decides from it which engine runs each collective; algorithms never look.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cclctl.runtime.transport.hybrid import Hierarchy
    from cclctl.runtime.transport.shm.group import ShmGroup


@dataclasses.dataclass(frozen=True, slots=True)
class Capabilities:
    """``one_copy``: every rank of the communicator shares this host's segments (one-copy and
    zero-copy collectives); ``hierarchy``: the ranks span hosts, grouped by host."""

    one_copy: ShmGroup | None = None
    hierarchy: Hierarchy | None = None


#: Point-to-point steps only (TCP; shared memory once a link was dropped).
POINT_TO_POINT = Capabilities()
