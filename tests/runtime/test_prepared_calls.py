"""Zero-copy calls remember their checks for the next call with the very same arrays."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest
from shm_thread_ranks import run_ranks

from cclctl.errors import InvalidArgument
from cclctl.runtime.comm import selection
from cclctl.runtime.comm.communicator import Communicator
from cclctl.runtime.comm.prepared import PreparedCalls
from cclctl.runtime.transport.shm import shared_buffers

N = selection.ZERO_COPY_MIN_BYTES // 4  # int32 elements: just large enough for zero-copy


class CountingDescribe:
    """Counts the shared-buffer lookups (what a remembered call skips)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self._lock = threading.Lock()
        real = shared_buffers.describe

        def describe(arr: np.ndarray) -> shared_buffers.Descriptor | None:
            with self._lock:
                self.calls += 1
            return real(arr)

        monkeypatch.setattr(shared_buffers, "describe", describe)


def test_repeated_calls_skip_the_lookups_and_stay_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    lookups = CountingDescribe(monkeypatch)
    after_first: list[int] = []

    def body(comm: Communicator) -> None:
        r, n = comm.rank, comm.world_size
        a, out = comm.empty(N, np.int32), comm.empty(N, np.int32)
        part, g = comm.empty(N, np.int32), comm.empty(N * n, np.int32)
        rs, b = comm.empty(N, np.int32), comm.empty(N, np.int32)
        plain = np.empty(N, np.int32)  # staged into its slot of g on every call
        for it in range(4):
            a[:] = np.arange(N) * (r + 1) + it
            comm.all_reduce(a, out=out)
            assert np.array_equal(out, np.arange(N) * 3 + 2 * it)
            comm.all_reduce(a)  # in place
            assert np.array_equal(a, np.arange(N) * 3 + 2 * it)
            part[:] = 10 * r + it
            comm.all_gather(part, g)
            assert np.array_equal(g, np.repeat([it, 10 + it], N))
            plain[:] = 20 * r + it
            comm.all_gather(plain, g)
            assert np.array_equal(g, np.repeat([it, 20 + it], N))
            comm.reduce_scatter(g, rs, op="max")
            assert np.array_equal(rs, np.full(N, [it, 20 + it][r]))  # rank r's block, max
            b[:] = r + it
            comm.broadcast(b, root=1)
            assert np.array_equal(b, np.full(N, 1 + it))
            comm.barrier()
            if it == 0 and r == 0:
                after_first.append(lookups.calls)
            comm.barrier()

    run_ranks(2, body)
    assert after_first and after_first[0] > 0
    assert lookups.calls == after_first[0]  # calls 2-4 looked nothing up


def test_an_array_changed_in_place_is_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    lookups = CountingDescribe(monkeypatch)

    def body(comm: Communicator) -> int:
        a = comm.empty(N, np.int32)
        a[:] = 1
        comm.all_reduce(a)
        before = lookups.calls
        comm.barrier()
        a.shape = (2, N // 2)  # same object, new shape: checked again, still exact
        comm.all_reduce(a)
        assert np.array_equal(a, np.full((2, N // 2), 4))
        comm.barrier()
        grew = lookups.calls > before
        a.flags.writeable = False  # an in-place call on it must now be refused
        with pytest.raises(InvalidArgument, match="read-only"):
            comm.all_reduce(a)
        return int(grew)

    assert run_ranks(2, body) == [1, 1]


def test_the_memory_keeps_no_array_alive() -> None:
    prepared = PreparedCalls()
    a, out = np.zeros(4), np.zeros(4)
    prepared.keep("all_reduce", (a, None), "plan")
    assert prepared.get("all_reduce", a, None) == "plan"
    assert prepared.get("all_reduce", a, out) is None  # an out it was not given
    assert prepared.get("all_reduce", out, None) is None  # another array
    assert prepared.get("all_gather", a, None) is None  # another op
    gone = weakref.ref(a)
    del a
    gc.collect()
    assert gone() is None
    assert prepared.get("all_reduce", np.zeros(4), None) is None
