"""Bandwidth as nccl-tests defines it, so cclctl's numbers compare with theirs.

``algbw = size / time`` and ``busbw = algbw * factor``, where the factor turns the
algorithm bandwidth into the rate at which the busiest link must move data; it lets
numbers from different world sizes and collectives be compared with the hardware's peak.
"""

from __future__ import annotations

#: Collectives, as torch.distributed names them.
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
)


def bus_factor(op: str, world_size: int) -> float:
    """The busbw/algbw factor of ``op`` for ``world_size`` ranks (nccl-tests' PERFORMANCE.md)."""
    n = max(world_size, 1)  # one rank: the formulas give 0 where nothing crosses a link
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "barrier":
        return 0.0
    return 1.0  # broadcast, reduce, send, recv, sendrecv


def algbw_gbps(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (10^9 bytes per second, as nccl-tests prints it)."""
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0
