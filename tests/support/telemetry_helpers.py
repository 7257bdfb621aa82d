"""Factories for the telemetry tests: configurations, records, a fake store, polling."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from cclctl.config import RuntimeConfig
from cclctl.records import COMPLETED, CollectiveRecord
from cclctl.telemetry.hub import Telemetry

T0 = 1_700_000_000_000_000_000  # a fixed wall-clock start, so expected values are exact


def config(**changes: object) -> RuntimeConfig:
    return RuntimeConfig(job="job1", hostname="node-a").replace(**changes)


def run(
    tel: Telemetry,
    comm: str,
    seq: int,
    op: str = "all_reduce",
    *,
    nbytes: int = 1024,
    duration_ns: int = 50_000,
    state: str = COMPLETED,
    world_size: int | None = None,
    start_ns: int | None = None,
    peer: int | None = None,
) -> CollectiveRecord:
    """Drive one record through start() and its end as the runtime would; a
    ``world_size`` declares ``comm`` with that many members first (else Telemetry's own).
    """
    if world_size is not None:
        tel.register_comm(comm, list(range(world_size)))
    begin = T0 + seq * 1_000_000 if start_ns is None else start_ns
    rec = CollectiveRecord(comm, seq, op, nbytes=nbytes, start_ns=begin, peer=peer)
    tel.start(rec)
    rec.state = state
    rec.end_ns = begin + duration_ns  # last: the record has now ended
    return rec


class DictStore:
    """The job's store reduced to a dict with a lock; fails its first ``fail`` calls."""

    def __init__(self, fail: int = 0) -> None:
        self.data: dict[str, bytes] = {}
        self.calls = 0
        self.fail = fail
        self.lock = threading.Lock()

    def set(self, key: str, value: bytes) -> None:
        with self.lock:
            self.calls += 1
            if self.calls <= self.fail:
                raise ConnectionError("store is down")
            self.data[key] = value

    def get(self, key: str) -> bytes | None:
        with self.lock:
            return self.data.get(key)


def wait_for(cond: Callable[[], object], timeout_s: float = 5.0) -> None:
    """Poll ``cond`` until it is true; fail the test (never hang) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)
