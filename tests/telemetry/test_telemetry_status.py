"""The status publisher writes fresh status records and survives a failing store."""

from __future__ import annotations

import os
import time

import pytest
from telemetry_helpers import T0, DictStore, run, wait_for

from cclctl.errors import UsageError
from cclctl.records import CollectiveRecord, snapshot_from_json
from cclctl.telemetry.status import GAP_INTERVALS, StatusPublisher


@pytest.mark.timeout(20)
def test_publisher_writes_the_status_record(make_tel):
    tel = make_tel(rank=3, world_size=4)
    tel.register_comm("w", [0, 1, 2, 3])
    run(tel, "w", 1, nbytes=2048)
    hung = CollectiveRecord("w", 2, "all_reduce", start_ns=T0 + 10**10, waiting_on=1)
    hung.waiting_for = "recv"
    tel.start(hung)
    url = tel.serve_metrics(0)
    store = DictStore()
    before = time.time_ns()
    tel.publish_to(store, interval_s=0.05, prefix="job1/status/")
    wait_for(lambda: store.get("job1/status/3") is not None)

    raw = store.get("job1/status/3")
    assert raw is not None
    snap = snapshot_from_json(raw)
    assert snap.kind == "status" and (snap.rank, snap.world_size) == (3, 4)
    assert (snap.host, snap.pid, snap.metrics_url) == ("node-a", os.getpid(), url)
    assert snap.time_ns >= before and tel.heartbeat_ns >= snap.time_ns
    assert (snap.comms["w"].last_started, snap.comms["w"].last_completed) == (2, 1)
    assert snap.inflight == hung
    assert [(r.seq, r.state) for r in snap.records] == [(1, "completed"), (2, "started")]
    assert snap.counters["collectives"] == 1 and snap.counters["bytes"] == 2048


@pytest.mark.timeout(20)
def test_heartbeat_keeps_moving(make_tel):
    tel = make_tel()
    store = DictStore()
    tel.publish_to(store, interval_s=0.02)
    wait_for(lambda: store.get("status/0") is not None)
    first = snapshot_from_json(store.get("status/0") or b"").time_ns
    wait_for(lambda: snapshot_from_json(store.get("status/0") or b"").time_ns > first)


@pytest.mark.timeout(20)
def test_publisher_survives_a_failing_store_and_counts_it(make_tel):
    tel = make_tel(status_interval_s=0.02)
    store = DictStore(fail=3)
    tel.publish_to(store)
    wait_for(lambda: store.get("status/0") is not None)
    assert store.calls >= 4
    assert tel.metrics_view().publish_errors == 3
    wait_for(
        lambda: snapshot_from_json(store.get("status/0") or b"").counters["publish_errors"] == 3
    )


@pytest.mark.timeout(20)
def test_close_publishes_a_final_status(make_tel):
    tel = make_tel()
    store = DictStore()
    tel.publish_to(store, interval_s=60)  # only the first and the final publish happen
    wait_for(lambda: store.get("status/0") is not None)
    run(tel, "w", 1)
    run(tel, "w", 2)
    tel.close()
    snap = snapshot_from_json(store.get("status/0") or b"")
    assert snap.comms["w"].last_completed == 2 and snap.counters["collectives"] == 2
    assert store.calls == 2
    tel.close()
    assert store.calls == 2


def test_publishing_twice_or_after_close_is_refused(make_tel):
    tel = make_tel()
    tel.publish_to(DictStore(), interval_s=60)
    with pytest.raises(UsageError, match="already publishes"):
        tel.publish_to(DictStore())
    tel.close()
    other = make_tel()
    other.close()
    with pytest.raises(UsageError, match="closed"):
        other.publish_to(DictStore())
    with pytest.raises(UsageError, match="interval"):
        make_tel().publish_to(DictStore(), interval_s=0)


def test_unknown_snapshot_kind_is_a_usage_error(make_tel):
    with pytest.raises(UsageError, match="snapshot kind"):
        make_tel().snapshot("everything")


@pytest.mark.timeout(20)
def test_publish_now_writes_immediately(make_tel):
    tel = make_tel()
    assert tel.publish_now() is False  # nothing to publish to yet
    store = DictStore()
    tel.publish_to(store, interval_s=60)
    wait_for(lambda: store.get("status/0") is not None)
    tel.count_hang("w", "all_reduce")
    assert tel.publish_now() is True
    assert snapshot_from_json(store.get("status/0") or b"").counters["hangs"] == 1


@pytest.mark.timeout(20)
def test_status_shows_the_last_failed_call_and_says_closed_at_the_end(make_tel):
    tel = make_tel(rank=1, world_size=2)
    tel.register_comm("w", [0, 1])
    run(tel, "w", 1, nbytes=64)
    failed = CollectiveRecord("w", 2, "broadcast", start_ns=T0 + 10**9)
    tel.start(failed)
    failed.state, failed.error, failed.end_ns = "failed", "collective mismatch", T0 + 2 * 10**9
    snap = tel.snapshot("status")
    assert [(r.seq, r.op, r.state) for r in snap.records] == [(2, "broadcast", "failed")]
    assert snap.reason == ""
    store = DictStore()
    tel.publish_to(store, interval_s=10)
    tel.close()
    assert snapshot_from_json(store.get("status/1")).reason == "closed"


class FlakyStore:
    """Refuses every set while ``down``; counts reconnects as a StoreClient does."""

    def __init__(self) -> None:
        self.down = False
        self.reconnects = 0
        self.values: dict[str, bytes] = {}

    def set(self, key: str, value: bytes) -> None:
        if self.down:
            raise ConnectionResetError("reset by peer")
        self.values[key] = value


def test_a_publisher_back_from_a_gap_says_how_long_it_was() -> None:
    store = FlakyStore()
    publisher = StatusPublisher(store, "status/0", lambda: b"{}", interval_s=0.01)
    assert publisher.publish() and publisher.gap_s == 0.0
    store.down = True
    down_at = time.monotonic()
    while time.monotonic() - down_at <= 3 * GAP_INTERVALS * 0.01:
        assert not publisher.publish()  # failing turns, for longer than the gap threshold
    store.down, store.reconnects = False, 1
    assert publisher.publish()
    assert publisher.gap_s >= 3 * GAP_INTERVALS * 0.01 and publisher.reconnects == 1
    assert publisher.errors > 0
