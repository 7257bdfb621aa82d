"""What a transport offers beyond point-to-point steps: the engines selection may choose
(each a Protocol of :mod:`~cclctl.runtime.transport.engines`).

Selection (``runtime/comm/selection.py``) reads a transport's :class:`Capabilities` once per
communicator and decides from it which engine runs each collective; algorithms never look.
"""

from __future__ import annotations

import dataclasses

from cclctl.runtime.transport.engines import CrossMemory, HostHierarchy, OneCopy


@dataclasses.dataclass(frozen=True, slots=True)
class Capabilities:
    """``one_copy``: every rank of the communicator shares this host's segments (one-copy and
    zero-copy collectives); ``cross_memory``: beside it, this rank may read and write its
    peers' private memory (single-copy collectives on plain buffers); ``hierarchy``: the
    ranks span hosts, grouped by host."""

    one_copy: OneCopy | None = None
    cross_memory: CrossMemory | None = None
    hierarchy: HostHierarchy | None = None


#: Point-to-point steps only (TCP; shared memory once a link was dropped).
POINT_TO_POINT = Capabilities()
