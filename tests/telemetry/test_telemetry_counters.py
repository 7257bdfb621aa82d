"""Counters and the duration histogram are exact after synthetic records."""

from __future__ import annotations

import threading

import pytest
from telemetry_helpers import T0, run

from cclctl.records import ABORTED, FAILED, TIMED_OUT, CollectiveRecord
from cclctl.telemetry.counters import DURATION_BOUNDS_NS


def test_completed_collectives_feed_throughput_counters(make_tel):
    tel = make_tel(world_size=4)
    run(tel, "w", 1, "all_reduce", nbytes=1000, duration_ns=2_000_000)
    run(tel, "w", 2, "all_reduce", nbytes=3000, duration_ns=4_000_000)
    run(tel, "w", 3, "all_gather", nbytes=800, duration_ns=1_000_000)
    ops, _, _ = tel.copy_counters()
    ar, ag = ops[("w", "all_reduce")], ops[("w", "all_gather")]
    assert (ar.collectives, ar.bytes, ar.busy_ns) == (2, 4000, 6_000_000)
    assert ar.bus_bytes == pytest.approx(4000 * 2 * 3 / 4)  # all_reduce: 2(n-1)/n
    assert (ag.collectives, ag.bytes) == (1, 800)
    assert ag.bus_bytes == pytest.approx(800 * 3 / 4)  # all_gather: (n-1)/n
    assert ar.errors == {} and ar.hangs == 0 and ar.retries == 0


def test_failed_states_count_as_errors_not_throughput(make_tel):
    tel = make_tel()
    run(tel, "w", 1, state=FAILED)
    run(tel, "w", 2, state=TIMED_OUT)
    run(tel, "w", 3, state=FAILED)
    run(tel, "w", 4, state=ABORTED)
    tel.count_error("w", "all_reduce", "connect")
    tel.count_retry("w", "all_reduce")
    tel.count_retry("w", "all_reduce")
    tel.count_hang("w", "broadcast")
    ops, comms, _ = tel.copy_counters()
    ar = ops[("w", "all_reduce")]
    assert ar.errors == {"failed": 2, "timed_out": 1, "aborted": 1, "connect": 1}
    assert (ar.collectives, ar.bytes, ar.busy_ns, sum(ar.buckets)) == (0, 0, 0, 0)
    assert ar.retries == 2 and ops[("w", "broadcast")].hangs == 1
    assert comms[0].last_started == 4 and comms[0].last_completed == 0
    assert tel.failures() == 6


def test_histogram_bucket_edges_follow_prometheus_le(make_tel):
    tel = make_tel()
    durations = [0, 10_000, 10_001, 1_000_000_000, 100_000_000_000, 100_000_000_001]
    for seq, ns in enumerate(durations, 1):
        run(tel, "w", seq, duration_ns=ns)
    buckets = tel.copy_counters()[0][("w", "all_reduce")].buckets
    assert len(buckets) == len(DURATION_BOUNDS_NS) + 1
    expected = [0] * len(buckets)
    expected[0] = 2  # 0 and exactly 10 µs: le="1e-05" includes its bound
    expected[1] = 1  # 10 µs + 1 ns
    expected[DURATION_BOUNDS_NS.index(1_000_000_000)] = 1
    expected[len(DURATION_BOUNDS_NS) - 1] = 1  # exactly 100 s
    expected[-1] = 1  # past the last bound: +Inf only
    assert buckets == expected


def test_clock_stepping_back_never_decreases_counters(make_tel):
    tel = make_tel()
    run(tel, "w", 1, duration_ns=-5_000)
    st = tel.copy_counters()[0][("w", "all_reduce")]
    assert st.busy_ns == 0 and st.collectives == 1 and st.buckets[0] == 1


def test_point_to_point_does_not_move_collective_seqs(make_tel):
    tel = make_tel()
    run(tel, "w", 5)
    run(tel, "w", 40, "send", peer=2)
    info = tel.comm_infos()["w"]
    assert (info.last_started, info.last_completed) == (5, 5)
    assert tel.copy_counters()[0][("w", "send")].collectives == 1


def test_bus_factor_follows_the_world_size_given_at_finish(make_tel):
    tel = make_tel()
    run(tel, "w", 1, nbytes=1000, world_size=2)  # factor 1.0
    run(tel, "sub", 1, nbytes=1000, world_size=8)  # factor 1.75
    ops = tel.copy_counters()[0]
    assert ops[("w", "all_reduce")].bus_bytes == pytest.approx(1000.0)
    assert ops[("sub", "all_reduce")].bus_bytes == pytest.approx(1750.0)


def test_link_bytes_accumulate_per_peer(make_tel):
    tel = make_tel()
    tel.link_bytes(1, 100, 40)
    tel.link_bytes(1, 5, 0)
    tel.link_bytes(3, 0, 7)
    assert tel.copy_counters()[2] == {1: (105, 40), 3: (0, 7)}


def test_status_summary_reports_totals_and_last_busbw(make_tel):
    tel = make_tel(world_size=2)
    run(tel, "w", 1, nbytes=1_000_000, duration_ns=1_000_000, world_size=2)  # 1 GB/s
    run(tel, "w", 2, nbytes=4_000_000, duration_ns=1_000_000, world_size=2)  # 4 GB/s, last
    run(tel, "w", 3, state=FAILED)
    tel.count_hang("w", "all_reduce")
    counters = tel.snapshot().counters
    assert counters["collectives"] == 2 and counters["bytes"] == 5_000_000
    assert counters["errors"] == 1 and counters["hangs"] == 1 and counters["retries"] == 0
    assert counters["last_busbw_gbps"] == {"all_reduce": pytest.approx(4.0)}


@pytest.mark.timeout(20)
def test_counters_stay_exact_while_readers_fold_under_concurrent_writers(make_tel):
    """Writers queue without the lock and fold now and then; readers fold at any moment.

    Every reader must see a consistent state (no call counted before it started, none
    counted twice), and at the end every call is counted exactly once.
    """
    tel = make_tel()
    per_thread, threads = 5000, 4
    seen: list[str] = []

    def drive(comm: str) -> None:
        for seq in range(1, per_thread + 1):
            rec = CollectiveRecord(comm, seq, "all_reduce", nbytes=8, start_ns=1)
            tel.start(rec)
            rec.state = "completed"
            rec.end_ns = 2  # last, as every closer does: the record has now ended
            tel.link_bytes(0, 1, 1)
            if seq % 100 == 0:
                tel.fold()

    def read(stop: threading.Event) -> None:
        while not stop.is_set():
            ops, comms, _ = tel.copy_counters()
            done = sum(st.collectives for st in ops.values())
            started = sum(c.last_started for c in comms)
            if done > per_thread * threads or any(c.last_completed > c.last_started for c in comms):
                seen.append(f"inconsistent: {done} done, {started} started")
            tel.inflight()

    stop = threading.Event()
    reader = threading.Thread(target=read, args=(stop,))
    reader.start()
    workers = [threading.Thread(target=drive, args=(f"c{i % 2}",)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(15)
    stop.set()
    reader.join(5)
    assert not any(w.is_alive() for w in workers) and not reader.is_alive()
    assert seen == []
    ops, comms, links = tel.copy_counters()
    assert sum(st.collectives for st in ops.values()) == per_thread * threads
    assert sum(st.bytes for st in ops.values()) == 8 * per_thread * threads
    assert sum(sum(st.buckets) for st in ops.values()) == per_thread * threads
    assert links == {0: (per_thread * threads, per_thread * threads)}
    assert {c.comm: c.last_completed for c in comms} == {"c0": per_thread, "c1": per_thread}
    assert tel.inflight() == []


def test_queued_calls_are_counted_as_soon_as_anyone_reads(make_tel):
    """The hot path only queues; a scrape or status between folds still sees every call."""
    tel = make_tel()
    rec = run(tel, "w", 1, nbytes=100)
    assert tel.queued() == 1  # queued: the caller has not folded yet
    assert tel.copy_counters()[0][("w", "all_reduce")].collectives == 1
    assert tel.snapshot().counters["bytes"] == 100
    assert tel.records() == [rec] and tel.inflight() == []


def test_a_call_folded_in_flight_is_counted_once_when_it_ends(make_tel):
    """Nothing is handed over when a call ends: its end_ns, set last, is what folds see."""
    tel = make_tel()
    rec = CollectiveRecord("w", 1, "all_reduce", nbytes=64, start_ns=T0)
    tel.start(rec)
    assert tel.inflight() == [rec]  # folded while running: in flight, not counted
    st = tel.copy_counters()[0][("w", "all_reduce")]  # its series exists, at zero
    assert (st.collectives, st.bytes, st.busy_ns, st.error_count) == (0, 0, 0, 0)
    rec.state = "completed"  # a closer sets the state first ...
    assert tel.inflight() == [rec]  # ... and the call has not ended until end_ns is set
    rec.end_ns = T0 + 1_000
    for _ in range(3):  # any number of later folds count it exactly once
        assert tel.inflight() == []
        st = tel.copy_counters()[0][("w", "all_reduce")]
        assert (st.collectives, st.bytes, st.busy_ns) == (1, 64, 1_000)
    assert tel.comm_infos()["w"].last_completed == 1


def _counted(tel):
    """Everything a fold decides, in comparable form: counters per (comm, op), comm gauges,
    ring contents and the records left in flight.
    """
    ops, comms, _ = tel.copy_counters()
    counters = {
        key: (st.collectives, st.bytes, st.busy_ns, st.buckets, st.errors, st.last_ns)
        for key, st in ops.items()
    }
    gauges = {c.comm: (c.last_started, c.last_completed) for c in comms}
    return counters, gauges, [r.seq for r in tel.records()], [r.seq for r in tel.inflight()]


def test_one_fold_of_interleaved_runs_counts_as_folding_after_every_call(make_tel):
    """Records of two communicators and three ops, interleaved, completed, failed, in
    flight and point-to-point: one fold over all of them decides what folding after every
    call decides, including a call that was in flight at one fold and ended before the next.
    """
    calls = [  # comm, seq, op, state (None: still running at the fold), peer
        ("w", 1, "all_reduce", "completed", None),
        ("w", 2, "all_reduce", "completed", None),
        ("sub", 1, "all_reduce", "completed", None),
        ("w", 3, "all_gather", "failed", None),
        ("w", 4, "all_gather", None, None),
        ("w", 1, "send", "completed", 2),
        ("sub", 2, "broadcast", "completed", None),
        ("w", 5, "all_reduce", "timed_out", None),
        ("w", 6, "all_reduce", "completed", None),
    ]
    results = []
    for fold_each in (True, False):
        tel = make_tel(world_size=4)
        running = []
        for i, (comm, seq, op, state, peer) in enumerate(calls):
            rec = CollectiveRecord(comm, seq, op, nbytes=100 * (i + 1), start_ns=T0 + i, peer=peer)
            tel.start(rec)
            if state is None:
                running.append(rec)
            else:
                rec.state = state
                rec.end_ns = T0 + i + 1_000 * (i + 1)
            if fold_each:
                tel.fold()
        before_end = _counted(tel)
        for rec in running:  # ends after the first fold that saw it
            rec.state = "completed"
            rec.end_ns = rec.start_ns + 7_000
        results.append((before_end, _counted(tel)))
    assert results[0] == results[1]
    (counters, gauges, ring, inflight), (counters_after, _, _, _) = results[1]
    assert counters[("w", "all_reduce")][:2] == (3, 100 + 200 + 900)
    assert counters[("w", "all_reduce")][4] == {"timed_out": 1}
    assert counters[("w", "all_gather")][:2] == (0, 0) and inflight == [4]
    assert counters_after[("w", "all_gather")][:3] == (1, 500, 7_000)
    assert gauges == {"w": (6, 6), "sub": (2, 2)} and len(ring) == len(calls)
