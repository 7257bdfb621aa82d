"""instrument()/uninstrument() in this process (a one-rank gloo group), and how records of
calls that return early are closed (the completion tracker, with stand-in works).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cclctl.integrations.torch import wrap as cclctl_torch
from cclctl.integrations.torch.folding import Folder
from cclctl.integrations.torch.lanes import Lanes
from cclctl.integrations.torch.timing import Completions
from cclctl.records import COMPLETED, CollectiveRecord

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[Path]:
    """Instrumented before init, as `cclctl run` does; everything undone afterwards."""
    originals = (dist.all_reduce, dist.distributed_c10d.Work.wait)
    cclctl_torch.instrument(trace_dir=str(tmp_path), timeout_s=30)
    try:
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1
        )
        yield tmp_path
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        cclctl_torch.uninstrument()
        assert (dist.all_reduce, dist.distributed_c10d.Work.wait) == originals


@pytest.mark.timeout(30)
def test_a_one_rank_job_is_counted_and_dumped(one_rank: Path) -> None:
    sess = cclctl_torch.session()
    assert sess is not None
    t = torch.ones(256)
    assert dist.all_reduce(t) is None
    work = dist.all_reduce(t, async_op=True)
    assert isinstance(work, dist.distributed_c10d.Work)
    work.wait()
    dist.barrier()
    deadline = time.monotonic() + 5
    while sess.telemetry.inflight() and time.monotonic() < deadline:
        time.sleep(0.01)  # the async record closes from gloo's own thread
    recs = sess.telemetry.records()
    assert [(r.comm, r.seq, r.op, r.state, r.nbytes) for r in recs] == [
        ("0:0", 1, "all_reduce", COMPLETED, 1024),
        ("0:0", 2, "all_reduce", COMPLETED, 1024),
        ("0:0", 3, "barrier", COMPLETED, 0),
    ]
    view = sess.telemetry.metrics_view()
    assert view.backend == "gloo"
    assert view.ops[("0:0", "all_reduce")].collectives == 2
    path = sess.telemetry.dump("test")
    assert path is not None and Path(path).parent == one_rank
    dist.destroy_process_group()
    assert cclctl_torch.session() is None  # destroying the world ends the session


@pytest.mark.timeout(30)
def test_every_form_of_an_all_reduce_call_is_recorded_alike(one_rank: Path) -> None:
    """Positional, keyword, a tensor subclass (a Parameter), asynchronous and sparse calls
    all reach the group and are recorded alike (a sparse tensor is sized as dense). A call
    torch rejects in Python, before it reaches the group, is not recorded."""
    sess = cclctl_torch.session()
    assert sess is not None
    t = torch.ones(4, dtype=torch.float64)
    p = torch.nn.Parameter(torch.ones(4, dtype=torch.float64), requires_grad=False)
    group = dist.group.WORLD
    assert dist.all_reduce(t) is None
    assert dist.all_reduce(t, dist.ReduceOp.MAX, group) is None
    assert dist.all_reduce(tensor=t, op=dist.ReduceOp.SUM, group=group) is None
    assert dist.all_reduce(p) is None
    dist.all_reduce(t, async_op=True).wait()
    sparse = torch.sparse_coo_tensor(
        [[0, 3]], [1.0, 2.0], (4,), dtype=torch.float64, check_invariants=True
    )
    assert dist.all_reduce(sparse) is None
    with pytest.raises(ValueError, match="complex"):  # torch's own error, recorded as such
        dist.all_reduce(torch.ones(4, dtype=torch.complex64), op=dist.ReduceOp.MAX)
    deadline = time.monotonic() + 5
    while sess.telemetry.inflight() and time.monotonic() < deadline:
        time.sleep(0.01)
    recs = sess.telemetry.records()
    assert [(r.seq, r.op, r.dtype, r.count, r.nbytes, r.state) for r in recs] == [
        (seq, "all_reduce", "float64", 4, 32, COMPLETED) for seq in range(1, 7)
    ]
    assert all(r.end_ns >= r.start_ns > 0 for r in recs)


@pytest.mark.timeout(30)
def test_instrumenting_a_running_job_traces_the_groups_made_after(tmp_path: Path) -> None:
    """instrument() after init_process_group starts the session at once; the default group
    made before it is not a traced one, a group made after is."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    try:
        cclctl_torch.instrument()
        sess = cclctl_torch.session()
        assert sess is not None
        dist.broadcast(torch.ones(3), src=0)  # the default group predates instrument()
        sub = dist.new_group([0])
        dist.broadcast(torch.ones(3), src=0, group=sub)
        assert [(r.comm, r.seq, r.op, r.root) for r in sess.telemetry.records()] == [
            ("1:0", 1, "broadcast", 0)
        ]
    finally:
        dist.destroy_process_group()
        cclctl_torch.uninstrument()


class _Work:
    def __init__(self) -> None:
        self.completed = False

    def is_completed(self) -> bool:
        return self.completed

    def get_future(self) -> Any:
        raise RuntimeError("Work::getFuture not implemented.")


def _closer() -> tuple[list[tuple[int, str, int]], Any]:
    closed: list[tuple[int, str, int]] = []
    lock = threading.Lock()

    def close(rec: CollectiveRecord, error: BaseException | None, end_ns: int) -> None:
        with lock:
            closed.append((rec.seq, type(error).__name__ if error else "", end_ns))

    return closed, close


def test_a_work_without_future_closes_at_wait_or_when_polled_done() -> None:
    closed, close = _closer()
    done = Completions(close, poll_s=3600)  # no background poll: the test polls
    try:
        waited, polled = _Work(), _Work()
        assert done.on_future(CollectiveRecord("c", 1, "send", peer=1), waited) is False
        done.on_wait_or_poll(CollectiveRecord("c", 1, "send", peer=1), waited)
        done.on_wait_or_poll(CollectiveRecord("c", 2, "send", peer=1), polled)
        assert done.poll() == 0 and closed == []
        done.waited(waited)
        done.waited(waited)  # a second wait() closes nothing more
        polled.completed = True
        done.poll()  # closes it, unless the background thread's first poll came this late
        assert [c[:2] for c in closed] == [(1, ""), (2, "")]
        assert done.pending() == 0
    finally:
        done.close()


def test_close_ends_the_poll_thread_while_it_waits_between_polls() -> None:
    class Polled(_Work):  # never completes; says when the background poll looked at it
        def __init__(self) -> None:
            super().__init__()
            self.looked = threading.Event()

        def is_completed(self) -> bool:
            self.looked.set()
            return False

    done = Completions(lambda rec, error, end_ns: None, poll_s=3600)
    work = Polled()
    done.on_wait_or_poll(CollectiveRecord("c", 1, "send", peer=1), work)
    thread = done._thread
    assert thread is not None and work.looked.wait(10)  # polled once: now it waits an hour
    done.close()
    assert not thread.is_alive()  # not left waiting out the hour until the next poll
    assert done.pending() == 1  # still in flight: that is what it is


def test_cuda_style_events_give_the_duration_and_failures_close_with_the_error() -> None:
    class Event:
        def __init__(self, ready: bool, fail: bool = False) -> None:
            self.ready, self.fail = ready, fail

        def query(self) -> bool:
            if self.fail:
                raise RuntimeError("CUDA error: an illegal memory access")
            return self.ready

        def elapsed_time(self, end: Any) -> float:
            return 1.5  # milliseconds

    closed, close = _closer()
    done = Completions(close, poll_s=0.001)
    try:
        rec = CollectiveRecord("c", 7, "all_reduce", start_ns=1_000)
        done.on_events(rec, Event(True), Event(True))
        done.on_events(CollectiveRecord("c", 8, "all_reduce"), Event(True), Event(False, True))
        deadline = time.monotonic() + 5
        while len(closed) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # the background poll closes both
        assert sorted(closed) == [(7, "", 1_000 + 1_500_000), (8, "RuntimeError", 0)]
    finally:
        done.close()


@pytest.mark.timeout(30)
def test_the_session_counts_its_calls_on_its_own_thread(one_rank: Path) -> None:
    """Fewer calls than the backstop, and no reader: the session's folder still counts them
    (the queue drains), and the counters then read exactly what was called."""
    sess = cclctl_torch.session()
    assert sess is not None and sess.folder is not None
    for _ in range(5):
        dist.all_reduce(torch.ones(2))
    deadline = time.monotonic() + 5
    while sess.queued() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert sess.queued() == 0 and sess.telemetry.queued() == 0
    assert sess.telemetry.metrics_view().ops[("0:0", "all_reduce")].collectives == 5


class _Telemetry:
    """Stands in for a session's telemetry: counts folds, and can fail once."""

    def __init__(self, fail_first: bool) -> None:
        self.queue = 0
        self.folds = 0
        self.looks = 0  # how often the folder asked what is queued
        self.fail = fail_first

    def queued(self) -> int:
        self.looks += 1
        return self.queue

    def fold(self) -> None:
        self.folds += 1
        if self.fail:
            self.fail = False
            raise RuntimeError("folding broke")
        self.queue = 0


def test_the_folder_folds_only_what_is_queued_outlives_a_failed_fold_and_stops() -> None:
    tel = _Telemetry(fail_first=True)
    folder = Folder(tel, period_s=0.001, idle_s=0.001).start()
    try:
        deadline = time.monotonic() + 5
        while tel.looks < 5 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert tel.looks >= 5 and tel.folds == 0  # it looked: nothing queued, nothing folded
        tel.queue = 3
        deadline = time.monotonic() + 5
        while tel.queue and time.monotonic() < deadline:
            time.sleep(0.001)
        assert tel.queue == 0 and tel.folds == 2  # the failed fold, then the one that drained
    finally:
        folder.stop()
    assert not any(t.name == "cclctl-torch-fold" for t in threading.enumerate())


def test_a_lane_closes_records_as_their_futures_complete_and_never_blocks_close() -> None:
    """Futures completed from another thread (as gloo's worker completes a work): each
    record closes, a failed one with its error, and none of it runs on the completing
    thread; a future that never completes holds only its own lane, and close() returns."""
    closed, close = _closer()
    threads: list[str] = []

    def close_where(rec: CollectiveRecord, error: BaseException | None, end_ns: int) -> None:
        threads.append(threading.current_thread().name)
        close(rec, error, end_ns)

    lanes = Lanes(close_where)
    ok, bad, never = torch.futures.Future(), torch.futures.Future(), torch.futures.Future()
    lanes.add("g1", CollectiveRecord("g1", 1, "all_reduce"), ok)
    lanes.add("g1", CollectiveRecord("g1", 2, "all_reduce"), bad)
    lanes.add("g2", CollectiveRecord("g2", 1, "all_gather"), never)
    worker = threading.Thread(
        target=lambda: (ok.set_result(None), bad.set_exception(RuntimeError("peer gone"))),
        name="backend-worker",
    )
    worker.start()
    worker.join()
    deadline = time.monotonic() + 10
    while len(closed) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [c[:2] for c in closed] == [(1, ""), (2, "RuntimeError")]
    assert threads and all(name.startswith("cclctl-torch-lane g1") for name in threads)
    lanes.close(timeout_s=0.5)  # the g2 lane waits on `never` for ever: left behind
    assert len(closed) == 2
