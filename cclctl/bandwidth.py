"""Bandwidth as nccl-tests defines it, so cclctl's numbers compare with theirs.

``algbw = size / time`` and ``busbw = algbw * factor``, where the factor turns the
algorithm bandwidth into the rate at which the busiest link must move data; it lets
numbers from different world sizes and collectives be compared with the hardware's peak.
"""

from __future__ import annotations

#: Collectives, as torch.distributed names them, and all_to_allv (all_to_all of blocks of any
#: sizes, MPI's Alltoallv: torch's all_to_all_single with splits). Their index is their code
#: on the wire, so a new one comes last.
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "send",
    "recv",
    "barrier",
    "all_to_allv",
)

#: The collectives whose count differs by rank: their calls agree on everything else, and
#: each message's size is checked against what its receiver expects.
VARYING = ("all_to_allv",)


def bus_factor(op: str, world_size: int) -> float:
    """The busbw/algbw factor of ``op`` for ``world_size`` ranks (nccl-tests' PERFORMANCE.md)."""
    n = max(world_size, 1)  # one rank: the formulas give 0 where nothing crosses a link
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "all_to_allv"):
        return (n - 1) / n
    if op == "barrier":
        return 0.0
    return 1.0  # broadcast, reduce, send, recv, sendrecv


def algbw_gbps(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (10^9 bytes per second, as nccl-tests prints it)."""
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0
