"""A confirmed all_gather or broadcast lends its output to its links' tails instead of copying.

With resume on, a TCP step keeps the unacknowledged end of each large message it sent, for a
resume after a reset. Where the call ends with a confirm (retry on, 1 MiB or more) and is an
all_gather or a broadcast, whose output holds only final bytes once written, the call names
that output as settled, and the tail is a view of it (``Wait.settled``,
``step_resume.keep_tails``). These tests run the real algorithms over loopback TCP with a
confirming ending and look at what each step's end was told: every message large enough
to keep a tail was sent from inside the settled span, and nothing else is named settled.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from thread_ranks import run_comms

from cclctl.config import RuntimeConfig
from cclctl.runtime.comm.communicator import Communicator, world_comm_id
from cclctl.runtime.comm.recovery.call import Call
from cclctl.runtime.comm.rerun import CONFIRM_FROM, Ending
from cclctl.runtime.transport.tcp import step_resume
from cclctl.runtime.transport.tcp.links import Links
from cclctl.runtime.transport.tcp.step_resume import TAIL_MIN_BYTES
from cclctl.runtime.transport.tcp.transport import TcpTransport

pytestmark = pytest.mark.timeout(120)

N = 3
COUNT = CONFIRM_FROM // 4 * 2  # float32: 2 MiB, a confirmed size


def _comms(algo: str = "") -> list[Communicator]:
    """``N`` thread ranks over loopback TCP whose links resume (and so keep tails)."""
    cfg = RuntimeConfig(job="settled", timeout_s=30.0, connect_timeout_s=10.0, algo=algo)
    transports = [
        TcpTransport(Links(r, N, cfg.job, "127.0.0.1", 10.0, token="settled-tails", resume_s=5.0))
        for r in range(N)
    ]
    for t in transports:
        t.set_peers([p.address for p in transports])
    return [
        Communicator(rank=r, world_size=N, transport=t, cfg=cfg, comm_id=world_comm_id(N))
        for r, t in enumerate(transports)
    ]


Seen = list[tuple[int, Any, list[memoryview]]]


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Seen:
    """Every step end's (rank, settled span, views sent), the real tails kept as before."""
    got: Seen = []
    real = step_resume.keep_tails

    def keep_tails(links: Links, sends: dict[int, Any], settled: Any = None) -> None:
        got.append((links.rank, settled, [view for _, _, view in sends.values()]))
        real(links, sends, settled)

    monkeypatch.setattr(step_resume, "keep_tails", keep_tails)
    return got


def _span(arr: np.ndarray) -> tuple[int, int]:
    return arr.ctypes.data, arr.ctypes.data + arr.nbytes


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, np.uint8).ctypes.data)


def _all_in_span(seen: Seen, settled: dict[int, np.ndarray]) -> None:
    """Every step of the call (its confirm's too) was told its rank's ``settled`` array, and
    every message large enough to keep a tail was sent from inside it."""
    assert seen and all(span == _span(settled[rank]) for rank, span, _ in seen)
    large = [(span, v) for _, span, views in seen for v in views if len(v) >= TAIL_MIN_BYTES]
    assert large and all(s[0] <= _address(v) and _address(v) + len(v) <= s[1] for s, v in large)


def _run(fn: Callable[[Communicator], Any], algo: str = "") -> list[Any]:
    return run_comms(_comms(algo), fn)


def _ending(op: str, nbytes: int) -> Ending:
    return Ending.of(op, nbytes, np.dtype(np.float32))


def _inputs(rank: int, count: int = COUNT) -> np.ndarray:
    return np.random.default_rng(rank).standard_normal(count).astype(np.float32)


@pytest.mark.parametrize("in_place", [False, True], ids=["apart", "in-place"])
def test_a_confirmed_all_gathers_messages_all_lie_in_its_settled_output(
    seen: Seen, in_place: bool
) -> None:
    outs: dict[int, np.ndarray] = {}

    def body(comm: Communicator) -> np.ndarray:
        out = np.zeros(COUNT * N, np.float32)
        buf = out[comm.rank * COUNT : (comm.rank + 1) * COUNT] if in_place else _inputs(99)
        buf[...] = _inputs(comm.rank)
        outs[comm.rank] = out
        comm.attempt(Call.all_gather(buf, out), _ending("all_gather", out.nbytes))
        return out

    results = _run(body)
    want = np.concatenate([_inputs(r) for r in range(N)])
    assert all(np.array_equal(res, want) for res in results)
    _all_in_span(seen, outs)


@pytest.mark.parametrize("algo", ["chain", "tree"])
@pytest.mark.parametrize("root", range(N))
def test_a_confirmed_broadcasts_messages_all_lie_in_its_settled_buffer(
    seen: Seen, algo: str, root: int
) -> None:
    bufs: dict[int, np.ndarray] = {}

    def body(comm: Communicator) -> np.ndarray:
        buf = _inputs(root) if comm.rank == root else np.zeros(COUNT, np.float32)
        bufs[comm.rank] = buf
        comm.attempt(Call.broadcast(buf, root), _ending("broadcast", buf.nbytes))
        return buf

    results = _run(body, algo)
    assert all(np.array_equal(res, _inputs(root)) for res in results)
    _all_in_span(seen, bufs)


def test_calls_that_rewrite_what_they_sent_or_keep_a_copy_settle_nothing(seen: Seen) -> None:
    """An all_reduce and a reduce_scatter send partial sums their later steps write over; a
    call below the confirm's size keeps a copy for ranks behind; a call without an ending
    (retry off) confirms nothing: each tail stays a copy."""

    def body(comm: Communicator) -> None:
        x = _inputs(comm.rank)
        comm.attempt(Call.all_reduce(x.copy()), _ending("all_reduce", x.nbytes))
        out = np.zeros(COUNT // N, np.float32)
        x3 = _inputs(comm.rank, COUNT // N * N)
        comm.attempt(Call.reduce_scatter(x3, out), _ending("reduce_scatter", x3.nbytes))
        small, gathered = _inputs(comm.rank, 1024), np.zeros(1024 * N, np.float32)
        comm.attempt(Call.all_gather(small, gathered), _ending("all_gather", gathered.nbytes))
        comm.attempt(Call.broadcast(x, 0))

    _run(body)
    assert seen and all(span is None for _, span, _ in seen)


@pytest.mark.parametrize("settled", [False, True], ids=["copied", "settled"])
def test_a_message_wholly_unacknowledged_keeps_its_header_and_lends_its_payload(
    monkeypatch: pytest.MonkeyPatch, settled: bool
) -> None:
    """Where the peer's kernel acknowledged none of the message, its tail is the whole
    message from its header on: the header's own bytes and the payload, lent where it lies
    in the settled span, copied with the header otherwise."""
    links = Links(0, 2, "settled", "127.0.0.1", 5.0, token="settled-tails", resume_s=5.0)
    ours, theirs = socket.socketpair()
    try:
        links.socks[1] = ours
        monkeypatch.setattr(step_resume, "unacked", lambda sock: 1 << 40)
        payload = np.random.default_rng(1).integers(0, 256, TAIL_MIN_BYTES, dtype=np.uint8)
        span = _span(payload) if settled else None
        step_resume.keep_tails(links, {1: (3, b"HEADER-8", payload.data.cast("B"))}, span)
        index, start, parts = links.tails[1]
        assert (index, start) == (3, 0)
        assert b"".join(parts) == b"HEADER-8" + payload.tobytes()
        lent = [np.shares_memory(np.frombuffer(p, np.uint8), payload) for p in parts]
        assert any(lent) == settled
    finally:
        links.socks.pop(1, None)
        links.close()
        ours.close()
        theirs.close()
