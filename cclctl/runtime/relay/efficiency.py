"""How well a relayed call hid its stages behind each other: ``relay_efficiency``.

Each stage's bandwidth is the call's bus bytes over that stage's time, the unit busbw is
in, so ``busbw / min(stage bandwidths)`` is the slowest stage's time over the call's:
1.0 when the pipeline hides every other stage behind the slowest (the best a relay can
do), about 1/3 when three equal stages run one after the other.
"""

from __future__ import annotations

from collections.abc import Mapping

from cclctl.bandwidth import bus_factor


def stage_busbw_gbps(
    op: str, nbytes: int, world_size: int, stages: Mapping[str, int]
) -> dict[str, float]:
    """Each timed stage's bandwidth in GB/s of the call's bus bytes (stages of 0 ns: none)."""
    bus = nbytes * bus_factor(op, world_size)
    return {name: bus / ns for name, ns in stages.items() if ns > 0}


def relay_efficiency(
    op: str, nbytes: int, world_size: int, duration_ns: int, stages: Mapping[str, int]
) -> float:
    """``busbw / min(stage bandwidths)`` of one relayed call (0.0 where nothing was timed)."""
    bandwidths = stage_busbw_gbps(op, nbytes, world_size, stages)
    if duration_ns <= 0 or not bandwidths:
        return 0.0
    busbw = nbytes * bus_factor(op, world_size) / duration_ns
    return busbw / min(bandwidths.values())
