"""instrument()/uninstrument() in this process (a one-rank gloo group), and how records of
calls that return early are closed (the completion tracker, with stand-in works).
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cclctl.integrations.torch import wrap as cclctl_torch
from cclctl.integrations.torch.folding import Folder
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
    """Plain CPU tensors take the wrapper's quick path, a tensor subclass (a Parameter) and
    an asynchronous call the general one: the records must not tell them apart. A sparse
    tensor takes the quick path too, and is sized as dense (its ``nbytes`` raises)."""
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
    ] + [(7, "all_reduce", "complex64", 4, 32, "failed")]
    assert recs[-1].error is not None and recs[-1].error.startswith("ValueError")
    assert all(r.end_ns >= r.start_ns > 0 for r in recs)


@pytest.mark.timeout(30)
def test_instrumenting_a_running_job_starts_at_once(tmp_path: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    try:
        dist.all_reduce(torch.ones(1))  # before: not counted
        cclctl_torch.instrument()
        sess = cclctl_torch.session()
        assert sess is not None
        dist.broadcast(torch.ones(3), src=0)
        assert [(r.seq, r.op, r.root) for r in sess.telemetry.records()] == [(1, "broadcast", 0)]
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
        assert done.poll() == 1
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


@pytest.mark.timeout(30)
def test_a_quick_call_is_built_off_its_thread_yet_every_reader_sees_it(one_rank: Path) -> None:
    """The quick path hands over a list and marks its end there; readers still see the
    call at once: in flight while it runs (the watchdog's view), then ended, counted once.
    A failed call keeps torch's error, and a call the watchdog timed out stays timed out."""
    from cclctl.integrations.torch.session import QUICK_END

    def quick_call(op: str, tensor: Any, group: Any) -> list[Any]:
        return [group, tensor, op, time.time_ns(), 0, None]  # as the quick wrapper builds it

    sess = cclctl_torch.session()
    assert sess is not None and sess.folder is not None
    sess.folder.stop()  # no background hand-over: only readers build the records here
    tel = sess.telemetry
    ok = quick_call("all_reduce", torch.ones(8), None)
    sess.quick.append(ok)
    [running] = tel.inflight()
    assert (running.seq, running.op, running.state, running.nbytes) == (
        1,
        "all_reduce",
        "started",
        32,
    )
    ok[QUICK_END] = running.start_ns + 5_000
    for _ in range(2):  # any number of reads count it once
        assert tel.inflight() == [] and running.state == COMPLETED and running.end_ns > 0
        st = tel.metrics_view().ops[("0:0", "all_reduce")]
        assert (st.collectives, st.bytes, st.busy_ns) == (1, 32, 5_000)
    bad = quick_call("all_reduce", torch.ones(2, dtype=torch.complex64), None)
    slow = quick_call("all_reduce", torch.ones(2), None)
    sess.quick.append(bad)
    sess.quick.append(slow)
    sess.fail_quick(bad, ValueError("all_reduce does not support MAX on complex\nmore"))
    [timed_out] = tel.inflight()
    timed_out.state = "timed_out"  # as the watchdog marks it
    sess.fail_quick(slow, RuntimeError("Connection closed by peer"))
    assert tel.inflight() == []
    assert [(r.seq, r.state, r.error) for r in tel.records()[1:]] == [
        (2, "failed", "ValueError: all_reduce does not support MAX on complex"),
        (3, "timed_out", "RuntimeError: Connection closed by peer"),
    ]
    assert tel.metrics_view().ops[("0:0", "all_reduce")].errors == {"failed": 1, "timed_out": 1}


@pytest.mark.timeout(30)
def test_a_quick_call_lets_go_of_its_tensor_once_its_record_is_built(one_rank: Path) -> None:
    """The quick path hands the tensor itself over, so its size and dtype are read off the
    calling thread; the session keeps it no longer than the next fold, and records the
    size and dtype it had in the call."""
    sess = cclctl_torch.session()
    assert sess is not None and sess.folder is not None
    sess.folder.stop()
    tensor = torch.ones(6, dtype=torch.float64)
    dist.all_reduce(tensor)
    alive = weakref.ref(tensor)
    del tensor
    gc.collect()
    assert alive() is not None  # handed over, not yet read
    [rec] = sess.telemetry.records()  # a reader folds first
    assert (rec.op, rec.dtype, rec.count, rec.nbytes, rec.state) == (
        "all_reduce",
        "float64",
        6,
        48,
        COMPLETED,
    )
    gc.collect()
    assert alive() is None


@pytest.mark.timeout(30)
def test_a_general_call_after_quick_ones_is_recorded_after_them(one_rank: Path) -> None:
    """Quick calls not yet built start before a later call of the general path, so a
    communicator's last finished call (what a status shows) is the latest one."""
    sess = cclctl_torch.session()
    assert sess is not None and sess.folder is not None
    sess.folder.stop()
    dist.all_reduce(torch.ones(2))  # quick: handed over, not built yet
    with pytest.raises((ValueError, RuntimeError)):
        dist.broadcast(torch.ones(2), src=5)  # general: torch refuses a rank not in the group
    [last] = sess.telemetry.last_finished()
    assert (last.seq, last.op, last.state) == (2, "broadcast", "failed")


@pytest.mark.timeout(30)
def test_quick_calls_on_a_group_are_counted_though_it_is_destroyed_before_a_fold(
    one_rank: Path,
) -> None:
    """Quick calls are numbered later, by group: destroying the group must not lose them.
    The first call on a new group takes the general path (which makes the group known);
    later ones the quick path; the numbering is one sequence across both."""
    sess = cclctl_torch.session()
    assert sess is not None and sess.folder is not None
    sess.folder.stop()  # nothing numbers the quick calls but the destroy
    sub = dist.new_group([0])
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t, group=sub)
    assert len(sess.quick) == 2  # the first call was the general path's
    dist.destroy_process_group(sub)
    assert sub not in sess.comms
    assert [(r.comm, r.seq, r.state) for r in sess.telemetry.records()] == [
        ("1:0", 1, COMPLETED),
        ("1:0", 2, COMPLETED),
        ("1:0", 3, COMPLETED),
    ]
    dist.all_reduce(t)
    assert [(r.comm, r.seq) for r in sess.telemetry.records()][-1] == ("0:0", 1)


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, str]:
    try:
        return ("returned", type(fn(*args, **kwargs)).__name__)
    except Exception as exc:
        return (type(exc).__name__, str(exc))


@pytest.mark.timeout(30)
def test_the_quick_wrapper_looks_and_answers_like_torchs_function(one_rank: Path) -> None:
    """Whichever quick wrapper runs: torch's name, docs and signature; torch's own answer to
    calls it cannot take quick (no tensor, an unhashable group, a truthy non-bool
    ``async_op``, keywords); and a call made from inside a wrapped call is not counted."""
    import inspect

    wrapped = dist.all_reduce
    original = wrapped.__wrapped__
    assert (wrapped.__name__, wrapped.__doc__, wrapped.__module__) == (
        original.__name__,
        original.__doc__,
        original.__module__,
    )
    assert inspect.signature(wrapped) == inspect.signature(original)
    t = torch.ones(3)
    for args, kwargs in [
        (("not a tensor",), {}),
        ((), {}),
        ((t,), {"group": [1]}),
        ((t,), {"grop": None}),
        ((t, dist.ReduceOp.SUM, None, 1), {}),
        ((), {"tensor": t, "async_op": False}),
    ]:
        assert _outcome(wrapped, *args, **kwargs) == _outcome(original, *args, **kwargs)
    sess = cclctl_torch.session()
    assert sess is not None
    state = cclctl_torch._state
    assert state is not None
    seen = len(sess.telemetry.records())
    state.inside.add(threading.get_ident())
    try:
        dist.all_reduce(t)  # as if called by another wrapped function: counted by it
    finally:
        state.inside.discard(threading.get_ident())
    assert len(sess.telemetry.records()) == seen
    dist.all_reduce(t)
    assert len(sess.telemetry.records()) == seen + 1


@pytest.mark.timeout(30)
def test_quick_calls_fold_themselves_when_the_folder_falls_behind(one_rank: Path) -> None:
    """With the session's folder stopped (as if starved), the quick path's backstop folds
    once FOLD_BACKSTOP calls wait: the queue stays bounded and no call is lost."""
    from cclctl.integrations.torch.folding import FOLD_BACKSTOP

    sess = cclctl_torch.session()
    assert sess is not None and sess.folder is not None
    sess.folder.stop()
    t = torch.ones(1)
    for _ in range(FOLD_BACKSTOP - 1):
        dist.all_reduce(t)
    assert len(sess.quick) == FOLD_BACKSTOP - 1  # nothing folded yet
    dist.all_reduce(t)
    assert len(sess.quick) == 0  # the call that filled the queue folded it
    dist.all_reduce(t)
    st = sess.telemetry.metrics_view().ops[("0:0", "all_reduce")]
    assert st.collectives == FOLD_BACKSTOP + 1
