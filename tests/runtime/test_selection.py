"""What runs each call: the record's ``algo`` is what selection chose, for every documented
form of ``CCLCTL_ALGO`` and for the defaults over shared memory, hybrid hosts and TCP.

Each case runs real thread ranks over the transport the configuration gives (shared memory
on one host unless ``CCLCTL_TRANSPORT=tcp``) and checks every result exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from recording_tracer import RecordingTracer
from shm_thread_ranks import make_transports, run_on

from cclctl.config import runtime_from_env
from cclctl.runtime.algorithms import zero_copy
from cclctl.runtime.comm.communicator import Communicator
from cclctl.runtime.transport.tcp.transport import TcpTransport

pytestmark = pytest.mark.timeout(60)

KiB, MiB = 1 << 10, 1 << 20
#: (op, bytes per rank's input, shared buffers?)
Call = tuple[str, int, bool]


def _input(comm: Communicator, count: int, shared: bool) -> np.ndarray:
    arr = comm.empty(count, np.int64) if shared else np.empty(count, np.int64)
    arr[:] = np.arange(count) % 1000 + comm.rank
    return arr


def _run_call(comm: Communicator, op: str, nbytes: int, shared: bool) -> np.ndarray:
    """Run ``op`` on int64 inputs of ``nbytes`` bytes; return what this rank got."""
    n, count = comm.world_size, nbytes // 8
    x = _input(comm, count, shared)
    if op == "all_reduce":
        return comm.all_reduce(x).copy()
    if op == "broadcast":
        return comm.broadcast(x, root=1).copy()
    if op == "reduce":
        return comm.reduce(x, root=0).copy()
    if op == "all_gather":
        out = comm.empty(count * n, np.int64) if shared else np.empty(count * n, np.int64)
        return comm.all_gather(x, out).copy()
    if op == "all_to_all":
        return comm.all_to_all(x, np.empty_like(x)).copy()
    assert op == "reduce_scatter"
    out = comm.empty(count // n, np.int64) if shared else np.empty(count // n, np.int64)
    return comm.reduce_scatter(x, out).copy()


def _want(op: str, nbytes: int, n: int, rank: int) -> np.ndarray:
    count = nbytes // 8
    base = np.arange(count) % 1000
    total = n * base + n * (n - 1) // 2
    if op == "all_reduce":
        return total
    if op == "broadcast":
        return base + 1
    if op == "reduce":
        return total if rank == 0 else base + rank  # non-roots keep their input
    if op == "all_gather":
        return np.concatenate([base + r for r in range(n)])
    k = count // n
    if op == "all_to_all":  # block ``rank`` of every rank's input, in rank order
        return np.concatenate([base[rank * k : (rank + 1) * k] + r for r in range(n)])
    return total[rank * k : (rank + 1) * k]


def _algos(
    env: dict[str, str], calls: Sequence[Call], n: int = 3, hosts: list[str] | None = None
) -> list[str]:
    """Run ``calls`` on ``n`` ranks (on ``hosts``, default one) configured by ``env``; check
    every result; return rank 0's record algos."""
    cfg = runtime_from_env({"CCLCTL_JOB": "selection", **env})
    cma = cfg.shm_cma != "never"  # thread ranks: "auto" as "always", whatever the cores
    transports = make_transports(n, hosts, choice=cfg.transport, cross_memory=cma)
    if cfg.transport == "tcp":
        assert all(isinstance(t, TcpTransport) for t in transports)
    tracer = RecordingTracer()

    def body(comm: Communicator) -> list[np.ndarray]:
        if comm.rank == 0:
            comm.tracer = tracer
        return [_run_call(comm, *call) for call in calls]

    results = run_on(transports, body, cfg)
    for rank, got in enumerate(results):
        for (op, nbytes, _), arr in zip(calls, got, strict=True):
            np.testing.assert_array_equal(arr, _want(op, nbytes, n, rank), err_msg=op)
    return [rec.algo for rec in tracer.finished]


TCP = {"CCLCTL_TRANSPORT": "tcp"}


EVERY_OP = [
    ("all_reduce", 3 * KiB, False),
    ("all_gather", 3 * KiB, False),
    ("reduce_scatter", 3 * KiB, False),
    ("reduce", 3 * KiB, False),
    ("broadcast", 3 * KiB, False),
]
OVER = pytest.mark.parametrize("transport", [{}, TCP], ids=["shm", "tcp"])


@OVER
def test_ring_runs_ring_wherever_an_op_has_it(transport: dict[str, str]) -> None:
    calls = [*EVERY_OP, ("all_reduce", 768 * KiB, True), ("all_reduce", 16, False)]
    algos = _algos({"CCLCTL_ALGO": "ring", **transport}, calls)
    broadcast = "tree" if transport else "shm_direct"  # broadcast has no ring
    # Shared buffers do not run zero-copy: ring was asked for. Two elements on three ranks
    # are too few for a ring: the small-message algorithm runs.
    assert algos == ["ring", "ring", "ring", "ring", broadcast, "ring", "rd"]


@OVER
def test_all_reduce_rd_runs_rd_at_every_size(transport: dict[str, str]) -> None:
    calls = [("all_reduce", 3 * KiB, False), ("all_reduce", 768 * KiB, True)]
    assert _algos({"CCLCTL_ALGO": "all_reduce=rd", **transport}, calls) == ["rd", "rd"]


@OVER
def test_broadcast_chain_runs_chain_at_every_size(transport: dict[str, str]) -> None:
    calls = [("broadcast", 3 * KiB, False), ("broadcast", 768 * KiB, True)]
    assert _algos({"CCLCTL_ALGO": "broadcast=chain", **transport}, calls) == ["chain"] * 2


SPLIT = [("all_reduce", 1 * MiB - 8, False), ("all_reduce", 1 * MiB, False)]


def test_a_size_threshold_moves_where_ring_starts_over_tcp() -> None:
    assert _algos({"CCLCTL_ALGO": "all_reduce>=1M=ring", **TCP}, SPLIT) == ["rd", "ring"]


#: single-copy through the kernel (which lets thread ranks reach their own process), and
#: the slots alone (``CCLCTL_SHM_CMA=never``)
CMA = pytest.mark.parametrize("cma", [True, False], ids=["cma", "slots"])


@CMA
def test_a_size_threshold_moves_where_the_engines_bandwidth_algorithm_starts(cma: bool) -> None:
    env = {"CCLCTL_ALGO": "all_reduce>=1M=ring", "CCLCTL_SHM_CMA": "always" if cma else "never"}
    assert _algos(env, SPLIT) == ["shm_direct", "shm_cma" if cma else "shm_rsag"]


DEFAULT_CALLS = [
    ("all_reduce", 3 * KiB, False),
    ("all_reduce", 768 * KiB, False),
    ("all_reduce", 768 * KiB, True),
    ("broadcast", 3 * KiB, False),
    ("broadcast", 768 * KiB, False),
    ("reduce", 3 * KiB, False),
    ("reduce", 768 * KiB, False),
    ("reduce", 768 * KiB - 8, False),  # count not a multiple of 3: no equal blocks
    ("all_gather", 768 * KiB, False),
    ("reduce_scatter", 768 * KiB, True),
]


@CMA
def test_default_on_one_host_over_shared_memory(cma: bool) -> None:
    assert _algos({"CCLCTL_SHM_CMA": "always" if cma else "never"}, DEFAULT_CALLS) == [
        "shm_direct",
        "shm_rsag",  # 768 KiB: single-copy from 1 MiB
        zero_copy.ALGO,
        "shm_direct",
        "shm_direct",
        "tree",
        "shm_direct",
        "ring",
        "shm_cma" if cma else "shm_direct",  # all_gather by its output, 2.25 MiB
        zero_copy.ALGO,
    ]


@CMA
def test_default_on_two_ranks_reduces_direct_below_1m(cma: bool) -> None:
    calls = [("all_reduce", 3 * KiB, False), ("all_reduce", 768 * KiB, False), *SPLIT[1:]]
    env = {"CCLCTL_SHM_CMA": "always" if cma else "never"}
    large = "shm_cma" if cma else "shm_rsag"
    assert _algos(env, calls, n=2) == ["shm_direct", "shm_direct", large]


@CMA
def test_single_copy_starts_at_its_sizes(cma: bool) -> None:
    calls = [
        ("all_gather", 192 * KiB, False),  # by its output: 576 KiB
        ("all_gather", 768 * KiB, False),  # 2.25 MiB
        ("reduce_scatter", 768 * KiB - 24, False),
        ("reduce_scatter", 3 * MiB, False),
        ("broadcast", 3 * MiB, False),  # keeps its slots
        ("all_to_all", 768 * KiB, False),
        ("all_to_all", 3 * MiB, False),
    ]
    got = _algos({"CCLCTL_SHM_CMA": "always" if cma else "never"}, calls)
    large = "shm_cma" if cma else "shm_direct"
    a2a = "shm_cma" if cma else "pairwise"  # all_to_all: at every size
    assert got == ["shm_direct", large, "shm_direct", large, "shm_direct", a2a, a2a]


def test_a_forced_algorithm_never_runs_single_copy() -> None:
    env = {"CCLCTL_ALGO": "ring", "CCLCTL_SHM_CMA": "always"}
    calls = [("all_reduce", 3 * MiB, False), ("all_gather", 3 * MiB, False)]
    assert _algos(env, calls) == ["ring", "ring"]


def test_default_on_one_host_over_tcp() -> None:
    assert _algos(TCP, DEFAULT_CALLS) == [
        "rd",
        "ring",
        "ring",  # shared buffers run zero-copy only over shared memory
        "tree",
        "chain",
        "tree",
        "ring",
        "ring",
        "ring",
        "ring",
    ]


@CMA
def test_default_across_hosts_is_hierarchical(cma: bool) -> None:
    calls = [("all_reduce", 3 * KiB, False), ("all_reduce", 768 * KiB, False), *EVERY_OP[1:]]
    env = {"CCLCTL_SHM_CMA": "always" if cma else "never"}
    algos = _algos(env, calls, n=4, hosts=["a", "a", "b", "b"])
    large = "hier_cma" if cma else "hier_ring"  # the hosts' phases single-copy, or slots
    assert algos == ["hier_rd", large, "ring", "ring", "tree", "tree"]


def test_a_host_without_single_copy_runs_its_phases_through_the_slots() -> None:
    """Rank 2 is alone on its host (no engine there): the others' hosts run single-copy,
    and every rank's result is exact (their phases across are the same ring)."""
    calls = [("all_reduce", 768 * KiB, False), ("all_reduce", 3 * MiB, True)]
    algos = _algos({"CCLCTL_SHM_CMA": "always"}, calls, n=3, hosts=["a", "a", "b"])
    assert algos == ["hier_cma", "hier_cma"]
