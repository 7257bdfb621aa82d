"""The relay's pipeline on its own (no ranks): what overlaps what, the staging memory it
holds, the chunk plans, and a host call that fails midway."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cclctl.errors import ConfigError
from cclctl.runtime.relay import plans
from cclctl.runtime.relay.copier import DoneCopy, HostCopier, ThreadCopier
from cclctl.runtime.relay.pipeline import STAGES, relay
from cclctl.runtime.relay.plans import Chunk
from cclctl.runtime.relay.pool import StagingPool


class LoggedCopy(DoneCopy):
    """A finished copy that logs when the pipeline waits on it."""

    def __init__(self, log: list[str], name: str) -> None:
        super().__init__(1)
        self.log, self.name = log, name

    def wait(self) -> None:
        self.log.append(f"wait {self.name}")


class LoggingCopier(HostCopier):
    """Copies at once, logging each copy started and waited on, and staging made."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.made = 0

    def staging(self, nbytes: int) -> np.ndarray:
        self.made += 1
        return super().staging(nbytes)

    def to_host(self, src: Any, offset: int, host: np.ndarray) -> LoggedCopy:
        super().to_host(src, offset, host)
        self.log.append(f"load {offset}")
        return LoggedCopy(self.log, f"load {offset}")

    def to_device(self, host: np.ndarray, dst: Any, offset: int) -> LoggedCopy:
        super().to_device(host, dst, offset)
        self.log.append(f"store {offset}")
        return LoggedCopy(self.log, f"store {offset}")


def _doubling(log: list[str]):
    def call(chunk: Chunk, inp: np.ndarray, out: np.ndarray) -> None:
        log.append(f"call {chunk.loads[0].dev}")
        out *= 2

    return call


def test_loads_run_ahead_of_the_host_call_and_stores_drain_behind_it():
    """Depth 4: two chunks are loaded ahead, and a buffer's store is only waited on when the
    buffer is loaded again, after the next host call has run."""
    copier = LoggingCopier()
    pool = StagingPool(copier, 64, 4)  # 16 float32 a chunk
    src = np.arange(96, dtype=np.float32)
    dst = np.zeros_like(src)
    chunks = plans.whole(96, pool.elements(src.dtype))
    ns = relay(pool, src, dst, src.dtype, chunks, _doubling(copier.log))
    log = copier.log
    assert np.array_equal(dst, src * 2)
    assert log.index("load 16") < log.index("load 32") < log.index("call 0")
    assert log.index("call 16") < log.index("wait store 0") < log.index("call 32")
    assert log.index("store 0") < log.index("call 16")  # issued once its call ran
    assert set(ns) == set(STAGES)
    assert copier.made == 4  # the ring, made once


def test_staging_never_grows_past_depth_times_chunk():
    copier = LoggingCopier()
    pool = StagingPool(copier, 4096, 3)
    for count in (10, 50_000, 300_000):
        src = np.ones(count, np.float64)
        relay(
            pool, src, src, src.dtype, plans.whole(count, pool.elements(src.dtype)), _doubling([])
        )
        assert np.all(src == 2)
        assert pool.allocated_bytes <= 3 * 4096
    assert copier.made == 3


@pytest.mark.timeout(30)
def test_a_failed_host_call_leaves_no_copy_in_flight():
    copier = ThreadCopier()
    try:
        pool = StagingPool(copier, 64, 3)
        src, dst = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
        chunks = plans.whole(64, pool.elements(src.dtype))

        def call(chunk: Chunk, inp: np.ndarray, out: np.ndarray) -> None:
            if chunk.loads[0].dev == 32:
                raise RuntimeError("the host collective failed")

        with pytest.raises(RuntimeError, match="host collective failed"):
            relay(pool, src, dst, src.dtype, chunks, call)
        assert np.array_equal(dst[:32], src[:32]) and not dst[32:].any()
        relay(pool, src, dst, src.dtype, chunks, lambda c, i, o: None)  # the ring is free again
        assert np.array_equal(dst, src)
    finally:
        copier.close()


def test_per_rank_plans_cut_every_part_alike():
    gather = plans.gather(10, 3, 16)  # 4 elements of each part per chunk
    assert [c.loads[0] for c in gather] == [
        plans.Piece(0, 0, 4), plans.Piece(4, 0, 4), plans.Piece(8, 0, 2)
    ]  # fmt: skip
    assert [p.dev for p in gather[2].stores] == [8, 18, 28]
    scatter = plans.scatter(10, 3, 16)
    assert [p.dev for p in scatter[1].loads] == [4, 14, 24] and scatter[1].out == (12, 4)
    exchange = plans.exchange(5, 2, 16)  # 4 elements of each block
    assert [(p.dev, p.host) for p in exchange[1].stores] == [(4, 2), (9, 3)]
    assert all(c.used <= 16 for c in gather + scatter + exchange)


def test_a_staging_buffer_too_small_for_the_parts_is_a_config_error():
    with pytest.raises(ConfigError, match="CCLCTL_STAGE_CHUNK"):
        plans.gather(10, 64, 32)
    with pytest.raises(ValueError, match="at least 2"):
        StagingPool(HostCopier(), 4096, 1)
