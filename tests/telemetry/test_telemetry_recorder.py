"""The flight recorder: bounded rings per communicator and the in-flight set."""

from __future__ import annotations

from telemetry_helpers import T0, run

from cclctl.records import CollectiveRecord


def test_ring_is_bounded_per_communicator(make_tel):
    tel = make_tel(trace_buffer=5)
    for seq in range(1, 13):
        run(tel, "a", seq)
    for seq in range(1, 3):
        run(tel, "b", seq)
    records = tel.records()
    assert [(r.comm, r.seq) for r in records if r.comm == "a"] == [("a", s) for s in range(8, 13)]
    assert [r.seq for r in records if r.comm == "b"] == [1, 2]
    assert len(records) == 7


def test_records_merge_communicators_in_start_order(make_tel):
    tel = make_tel()
    run(tel, "b", 1, start_ns=T0 + 30)
    run(tel, "a", 1, start_ns=T0 + 10)
    run(tel, "a", 2, start_ns=T0 + 40)
    run(tel, "b", 2, start_ns=T0 + 20)
    assert [(r.comm, r.seq) for r in tel.records()] == [("a", 1), ("b", 2), ("b", 1), ("a", 2)]


def test_zero_buffer_turns_the_ring_off_but_keeps_counting(make_tel):
    tel = make_tel(trace_buffer=0)
    run(tel, "w", 1)
    rec = CollectiveRecord("w", 2, "all_reduce", start_ns=T0)
    tel.start(rec)
    assert tel.inflight() == [rec]
    assert tel.records() == [rec]  # a dump still shows what is in flight
    assert tel.copy_counters()[0][("w", "all_reduce")].collectives == 1


def test_inflight_is_oldest_first_and_shares_the_runtime_record(make_tel):
    tel = make_tel()
    tel.register_comm("w", [0, 1, 2, 3])
    late = CollectiveRecord("w", 2, "all_reduce", start_ns=T0 + 500)
    early = CollectiveRecord("sub", 7, "broadcast", start_ns=T0 + 100)
    tel.start(late)
    tel.start(early)
    assert tel.inflight() == [early, late]
    late.step, late.waiting_on, late.waiting_for = 3, 2, "recv"  # the runtime, in place
    snap = tel.snapshot("status")
    assert snap.inflight == early
    assert [r.seq for r in snap.records] == [7, 2]
    assert snap.records[1].waiting_on == 2 and snap.records[1].step == 3
    late.state, late.end_ns = "completed", T0 + 900
    assert tel.inflight() == [early]
    assert tel.comm_infos()["w"].ranks == [0, 1, 2, 3]


def test_register_comm_again_updates_members_after_a_shrink(make_tel):
    tel = make_tel()
    tel.register_comm("w", [0, 1, 2, 3])
    run(tel, "w", 4)
    tel.register_comm("w", [0, 1, 3])
    info = tel.comm_infos()["w"]
    assert info.ranks == [0, 1, 3] and info.last_completed == 4


def test_records_keep_inflight_calls_the_ring_has_evicted(make_tel):
    tel = make_tel(trace_buffer=3)
    stuck = CollectiveRecord("w", 1, "all_reduce", start_ns=T0)
    tel.start(stuck)
    for seq in range(1, 6):  # point-to-point calls on the same communicator fill its ring
        run(tel, "w", seq, "send", peer=1)
    assert [r.op for r in tel.records()] == ["all_reduce", "send", "send", "send"]
    assert tel.records()[0] is stuck
