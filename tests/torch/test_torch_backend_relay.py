"""The ``cclctl`` backend's device-tensor path on CPU tensors under forced staging
(``CCLCTL_STAGE=always``): every collective of a process group equals the unstaged group's
result bit for bit (thread ranks, in this process), where ``docs/performance.md``, "The
relay", says the bits are the same; which way each call goes (relayed.py); a mixed group
left on ``auto`` fails, never computes wrong; in a real job (backend_relay_job.py), DDP's
losses under forced staging equal the unstaged run's and the relay's records and stage
metrics reach the rank's dump and exporter; and backend_job.py's comparison with gloo
(DDP, FSDP2, functional collectives) holds with every tensor relayed.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")

import torch.distributed as dist  # noqa: E402
from thread_ranks import run_ranks  # noqa: E402
from torch_jobs import child_env, run_job  # noqa: E402

from cclctl.config import RuntimeConfig  # noqa: E402
from cclctl.diagnose_io.dumpfile import read_dump  # noqa: E402
from cclctl.errors import InvalidArgument  # noqa: E402
from cclctl.integrations.torch.backend.process_group import CclctlProcessGroup  # noqa: E402
from cclctl.integrations.torch.backend.relayed import Placement, RelayView  # noqa: E402
from cclctl.integrations.torch.backend.views import HostView  # noqa: E402
from cclctl.integrations.torch.relay_copier import TensorRelay  # noqa: E402
from cclctl.runtime.comm.communicator import Communicator  # noqa: E402

CFG = RuntimeConfig(
    job="backend-relay", timeout_s=30.0, connect_timeout_s=10.0, stage_chunk=4096, stage_depth=3
)
DTYPES = (torch.float32, torch.int64, torch.bfloat16)
#: the ring's first size over TCP (docs/performance.md, "The relay"): a float sum of more
#: than 2 ranks from there may differ in the last bits, its chunks' segments not the whole's
RING_BYTES = 64 << 10
ROWS, COLS = 150, 7  # rows per rank block: a block of 4-8 KiB, so calls span staging chunks


def _bits(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())


def _opts(cls: Any, **fields: Any) -> Any:
    opts = cls()
    for name, value in fields.items():
        setattr(opts, name, value)
    return opts


def _calls(pg: CclctlProcessGroup, dtype: torch.dtype) -> dict[str, list[torch.Tensor]]:
    """Every collective of the group on this rank's inputs of ``dtype``; outputs by name."""
    n, rank = pg.comm.world_size, pg.comm.rank
    gen = torch.Generator().manual_seed(11 * rank + 1)
    x = (torch.randn(n * ROWS, COLS, generator=gen, dtype=torch.float64) * 50).to(dtype)
    block = x[:ROWS].clone()
    got: dict[str, list[torch.Tensor]] = {}

    def run(name: str, work: Any, outs: list[torch.Tensor]) -> None:
        work.wait()
        got[name] = outs

    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG):
        t = x.clone()
        run(f"all_reduce {op}", pg.allreduce([t], _opts(dist.AllreduceOptions, reduceOp=op)), [t])
    s = x.clone().t()  # not contiguous: a contiguous copy on its device, written back
    run("all_reduce strided", pg.allreduce([s], dist.ReduceOp.SUM), [s])
    pair = [x.clone(), block.clone()]
    run("all_reduce_coalesced", pg.allreduce_coalesced(pair, dist.ReduceOp.SUM), pair)
    t = x.clone()
    run("broadcast", pg.broadcast([t], _opts(dist.BroadcastOptions, rootRank=n - 1)), [t])
    t = x.clone()
    opts = _opts(dist.ReduceOptions, rootRank=1 % n, reduceOp=dist.ReduceOp.SUM)
    run("reduce", pg.reduce([t], opts), [t] if rank == 1 % n else [])
    one = torch.empty(n * ROWS, COLS, dtype=dtype)
    run("all_gather_into_tensor", pg._allgather_base(one, block), [one])
    outs = [torch.empty(ROWS, COLS, dtype=dtype) for _ in range(n)]
    run("all_gather list", pg.allgather([outs], [block]), outs)
    one = torch.empty(ROWS, COLS, dtype=dtype)
    run("reduce_scatter_tensor", pg._reduce_scatter_base(one, x, dist.ReduceOp.SUM), [one])
    one = torch.empty(ROWS, COLS, dtype=dtype)
    run("reduce_scatter list", pg.reduce_scatter([one], [list(x.chunk(n))]), [one])
    one = torch.empty_like(x)
    run("all_to_all_single", pg.alltoall_base(one, x, [], []), [one])
    ins = [(rank + j) % 3 + 1 for j in range(n)]
    outs_rows = [(i + rank) % 3 + 1 for i in range(n)]
    one = torch.empty(sum(outs_rows), COLS, dtype=dtype)
    run("all_to_all uneven", pg.alltoall_base(one, x[: sum(ins)], outs_rows, ins), [one])
    outs = [torch.empty(ROWS, COLS, dtype=dtype) for _ in range(n)]
    run("all_to_all list", pg.alltoall(outs, list(x.chunk(n))), outs)
    root = n - 1
    outs = [torch.empty(ROWS, COLS, dtype=dtype) for _ in range(n)] if rank == root else []
    run(
        "gather",
        pg.gather([outs] if outs else [], [block], _opts(dist.GatherOptions, rootRank=root)),
        outs,
    )
    one = torch.empty(ROWS, COLS, dtype=dtype)
    srcs = [list(x.chunk(n))] if rank == root else []
    run("scatter", pg.scatter([one], srcs, _opts(dist.ScatterOptions, rootRank=root)), [one])
    t = x.clone()
    if rank in (0, 1):  # rank 0 sends first, rank 1 receives first
        first, second = (pg.send, pg.recv) if rank == 0 else (pg.recv, pg.send)
        first([t], 1 - rank).wait()
        run("send_recv", second([t], 1 - rank), [t])
    flags = (x > 0).reshape(-1)[: ROWS * COLS].contiguous()  # bool: relayed as its bytes
    every = torch.empty(n * flags.numel(), dtype=torch.bool)
    run("all_gather bool", pg._allgather_base(every, flags), [every])
    return got


def _results(world: int, stage: str) -> list[dict[str, list[bytes]]]:
    def rank(comm: Communicator) -> dict[str, list[bytes]]:
        pg = CclctlProcessGroup(comm)
        try:
            out = {}
            for dtype in DTYPES:
                for name, tensors in _calls(pg, dtype).items():
                    out[f"{name} {dtype}"] = [_bits(t) for t in tensors]
            big = torch.arange(RING_BYTES // 4 + 999, dtype=torch.float32) / (comm.rank + 3)
            pg.allreduce([big], dist.ReduceOp.SUM).wait()  # past the ring's first size
            out["ring sum"] = [_bits(big)]
            relay = pg._placement._relay  # its calls so far: the relay's own seq
            seq = relay.relay(torch.device("cpu"))._seq if relay is not None else 0
            out["relayed"] = [str(seq).encode()]
            return out
        finally:
            pg._progress.close()

    return run_ranks(world, rank, CFG.replace(stage=stage), timeout_s=150)


def _ring_close(staged: bytes, unstaged: bytes) -> bool:
    a, b = (torch.frombuffer(bytearray(x), dtype=torch.float32) for x in (staged, unstaged))
    return torch.allclose(a, b, rtol=1e-6, atol=0)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 4])
def test_forced_staging_gives_the_unstaged_groups_bits(world: int) -> None:
    staged, unstaged = _results(world, "always"), _results(world, "auto")
    for rank in range(world):
        # the calls the relay has: 12 per dtype (coalesced: 2), and the ring-size sum
        assert staged[rank].pop("relayed") == [str(12 * len(DTYPES) + 1).encode()]
        assert unstaged[rank].pop("relayed") == [b"0"]
        assert set(staged[rank]) == set(unstaged[rank])
        for key, bits in staged[rank].items():
            if key == "ring sum" and world > 2:  # the rule's one exception: to float rounding
                assert _ring_close(bits[0], unstaged[rank][key][0]), rank
                continue
            assert bits == unstaged[rank][key], (rank, key)
    assert "send_recv torch.float32" in staged[0] and "gather torch.int64" in staged[world - 1]


# ------------------------------------------------------------------------ which way
def _placement(stage: str) -> Placement:
    return Placement(SimpleNamespace(cfg=CFG.replace(stage=stage)))  # type: ignore[arg-type]


def test_auto_keeps_cpu_tensors_zero_copy_on_the_communicator() -> None:
    place, t = _placement("auto"), torch.arange(6, dtype=torch.float32)
    comm, (view,) = place.direct([t], "all_reduce", reduces=True)
    assert comm is place.comm and isinstance(view, HostView) and not view.copied
    (whole,) = place.host([t], "gather", reduces=False)
    assert not whole.copied and place._relay is None


def test_always_relays_the_relays_calls_and_copies_the_others_whole() -> None:
    place, t = _placement("always"), torch.arange(6, dtype=torch.float32)
    comm, (view,) = place.direct([t], "all_reduce", reduces=True)
    assert isinstance(comm, TensorRelay) and comm is place.relay  # one relay per group
    assert isinstance(view, RelayView) and view.array.data_ptr() == t.data_ptr()
    (whole,) = place.host([t], "gather", reduces=False)
    assert whole.copied and whole.array.ctypes.data != t.data_ptr()
    whole.array[...] = 9
    whole.write_back()
    assert t.tolist() == [9.0] * 6


def test_a_device_tensor_is_relayed_under_auto_and_refused_under_never() -> None:
    dev = torch.empty(4, device="meta")
    comm, _ = _placement("auto").direct([dev], "broadcast", reduces=False)
    assert isinstance(comm, TensorRelay)
    with pytest.raises(InvalidArgument, match="CCLCTL_STAGE=never"):
        _placement("never").direct([torch.ones(4), dev], "broadcast", reduces=False)
    with pytest.raises(InvalidArgument, match="CCLCTL_STAGE=never"):
        _placement("never").host([dev], "gather", reduces=False)
    with pytest.raises(InvalidArgument, match="from one device; these are on cpu, meta"):
        _placement("auto").direct([torch.ones(4), dev], "all_gather", reduces=False)


def test_a_dtype_the_runtime_only_moves_is_relayed_as_bytes_and_not_reduced() -> None:
    place, flags = _placement("always"), torch.ones(8, dtype=torch.bool)
    _, (view,) = place.direct([flags], "all_gather", reduces=False)
    assert view.array.dtype == torch.uint8 and view.array.numel() == 8
    with pytest.raises(InvalidArgument, match=r"does not reduce torch\.complex64"):
        place.direct([torch.ones(2, dtype=torch.complex64)], "all_reduce", reduces=True)


# ------------------------------------------------------------------------ a real job
def _job(world: int, out: Path, **env: str) -> dict[int, dict[str, Any]]:
    out.mkdir()
    result, lines = run_job(
        "backend_relay_job.py", world, [str(out)], env=child_env(**env), timeout_s=150
    )
    assert result.returncode == 0, lines.text()[-6000:]
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(world)}


@pytest.mark.timeout(360)
@pytest.mark.slow  # two torch jobs: 50 s (2 ranks), 110 s (4) on this machine under load
@pytest.mark.parametrize("world", [2, 4])
def test_a_job_under_forced_staging_trains_alike_and_records_its_stages(
    world: int, tmp_path: Path
) -> None:
    staged = _job(world, tmp_path / "staged", CCLCTL_STAGE="always", CCLCTL_STAGE_CHUNK="4K")
    unstaged = _job(world, tmp_path / "unstaged", CCLCTL_STAGE="auto")
    for rank in range(world):
        got, want = staged[rank], unstaged[rank]
        assert got["results"] == want["results"]  # max, min and data movement: bit for bit
        if world == 2:  # a sum of two is the same whichever way it is cut: exact
            assert (got["losses"], got["params"]) == (want["losses"], want["params"])
        else:  # the relay's bits rule: a float sum of >2 ranks may differ in the last bits
            assert got["losses"] == pytest.approx(want["losses"], rel=1e-6)
            assert got["params"] == pytest.approx(want["params"], rel=1e-5, abs=1e-7)
        relay_id = f"{got['comm']}/relay"
        records = read_dump(got["dump"]).records
        relayed = [r for r in records if r.comm == relay_id]
        assert {r.op for r in relayed} >= {"all_reduce", "broadcast", "all_gather",
                                           "reduce_scatter", "all_to_all"}  # fmt: skip
        assert all(set(r.stages) == {"d2h", "collective", "h2d"} for r in relayed)
        assert not any(r.comm == relay_id for r in read_dump(want["dump"]).records)
        for stage in ("d2h", "collective", "h2d"):  # the exporter's series, per stage
            labels = f'comm="{relay_id}",op="all_reduce",rank="{rank}",stage="{stage}"'
            assert any(s.startswith("cclctl_relay_stage_seconds_total{") and labels in s
                       for s in got["stage_series"]), (stage, got["stage_series"])  # fmt: skip
        assert want["stage_series"] == []


@pytest.mark.timeout(120)
def test_a_rank_that_does_not_stage_where_another_does_fails_the_call_not_its_result() -> None:
    """A mixed group left on ``auto`` (rank 0 relays, rank 1 does not): the chunk calls
    meet the whole call and the runtime fails it on both ranks, naming both calls."""
    from thread_ranks import make_comms, run_comms

    comms = make_comms(2, CFG.replace(stage="always", timeout_s=20.0))

    def rank(comm: Communicator) -> str:
        pg = CclctlProcessGroup(comm)
        if comm.rank == 1:  # this rank keeps the host path
            pg._placement = Placement(comm, comm.cfg.replace(stage="auto"))
        try:
            pg.allreduce([torch.ones(4 * CFG.stage_chunk)], dist.ReduceOp.SUM).wait()
            return "no error"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            pg._progress.close()

    said = run_comms(comms, rank, timeout_s=90)
    for s in said:  # each rank names both calls: the chunk and the whole
        assert "count 1024" in s and "count 16384" in s, said


@pytest.mark.timeout(240)
@pytest.mark.slow  # one torch job of 2 ranks: 35 s on this machine under load
def test_the_backend_job_under_forced_staging_still_equals_gloo(tmp_path: Path) -> None:
    """backend_job.py (every collective, a new_group, DDP with and without a hook, FSDP2,
    functional collectives, each against gloo) with every tensor relayed: on 2 ranks all
    equal gloo's bit for bit, and both groups' calls are on their relay ids too."""
    result, lines = run_job(
        "backend_job.py", 2, [str(tmp_path)], timeout_s=200,
        env=child_env(CCLCTL_STAGE="always", CCLCTL_STAGE_CHUNK="4K"),
    )  # fmt: skip
    assert result.returncode == 0, lines.text()[-6000:]
    for rank in range(2):
        doc = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert doc["same"] and all(same is True for same in doc["same"].values()), doc["same"]
        ddp, fsdp = doc["ddp"], doc["fsdp"]
        assert ddp["cclctl"] == ddp["gloo"] and ddp["hook"] == ddp["gloo"]
        assert fsdp["cclctl"] == fsdp["gloo"]
        assert doc["functional_same"] is True and doc["params_alike"] is True
        relayed = {c for c in doc["comms"] if c.endswith("/relay")}
        assert relayed == {f"{c}/relay" for c in doc["comms"] if c not in relayed}
