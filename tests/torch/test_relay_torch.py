"""The torch relay on CPU tensors under forced staging (``CCLCTL_STAGE=always``): the same
results, bit for bit, as the communicator's own calls on the tensors' numpy views, for
every collective and dtype (bfloat16 through ml_dtypes, as the runtime holds it; a dtype
neither holds is refused in words). (No accelerator
here: the device path, a copy stream and timing events, runs in ``benchmarks/relay.py``
where one is present.)"""

from __future__ import annotations

import time

import numpy as np
import pytest
from thread_ranks import run_ranks

from cclctl.config import RuntimeConfig
from cclctl.errors import InvalidArgument
from cclctl.runtime.comm.communicator import Communicator

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

from cclctl.integrations.torch.relay_copier import TensorRelay, TorchCopier  # noqa: E402
from cclctl.runtime.relay.relay import Relay  # noqa: E402

CFG = RuntimeConfig(
    job="relay", timeout_s=30.0, connect_timeout_s=10.0, stage="always",
    stage_chunk=4096, stage_depth=3,
)  # fmt: skip
DTYPES = (torch.float32, torch.float64, torch.int32, torch.float16, torch.bfloat16)


def _np(t: torch.Tensor) -> np.ndarray:
    """A tensor's numpy view (bfloat16 as ml_dtypes', which torch does not know)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _pair(comm: Communicator, relay: TensorRelay, dtype: torch.dtype, part: int) -> list[str]:
    """Each collective on a tensor, staged and on the numpy view unstaged; what differs."""
    n, wrong = comm.world_size, []
    gen = torch.Generator().manual_seed(comm.rank * 7 + part)
    x = (torch.randn(n * part, generator=gen) * 100).to(dtype)
    part_x, nd = x[:part].clone(), _np(x).dtype
    cases = {
        "all_reduce": (lambda: relay.all_reduce(part_x.clone()),
                       lambda: comm.all_reduce(_np(part_x).copy())),
        "broadcast": (lambda: relay.broadcast(part_x.clone(), 1),
                      lambda: comm.broadcast(_np(part_x).copy(), 1)),
        "reduce": (lambda: relay.reduce(part_x.clone(), "sum", 0),
                   lambda: comm.reduce(_np(part_x).copy(), "sum", 0)),
        "all_gather": (lambda: relay.all_gather(part_x, torch.empty(n * part, dtype=dtype)),
                       lambda: comm.all_gather(_np(part_x), np.empty(n * part, nd))),
        "reduce_scatter": (lambda: relay.reduce_scatter(x, torch.empty(part, dtype=dtype)),
                           lambda: comm.reduce_scatter(_np(x), np.empty(part, nd))),
        "all_to_all": (lambda: relay.all_to_all(x, torch.empty_like(x)),
                       lambda: comm.all_to_all(_np(x), np.empty_like(_np(x)))),
    }  # fmt: skip
    for op, (staged, unstaged) in cases.items():
        if _np(staged()).tobytes() != unstaged().tobytes():
            wrong.append(f"{op} {dtype} x{part}")
    return wrong


@pytest.mark.timeout(120)
def test_staged_tensors_match_the_unstaged_calls():
    def rank(comm: Communicator) -> list[str]:
        relay = TensorRelay(comm, CFG)
        assert relay.staged(torch.ones(1))  # forced: a CPU tensor is staged too
        return [
            w for dtype in DTYPES for part in (50, 3001) for w in _pair(comm, relay, dtype, part)
        ]

    assert run_ranks(2, rank, CFG) == [[], []]


@pytest.mark.timeout(60)
def test_unrelayable_and_strided_tensors_are_refused_in_words():
    def rank(comm: Communicator) -> list[str]:
        relay, said = TensorRelay(comm, CFG), []
        for bad in (torch.ones(8, dtype=torch.complex64), torch.ones(4, 4).t()):
            with pytest.raises(InvalidArgument) as err:
                relay.all_reduce(bad)
            said.append(str(err.value))
        return said

    said = run_ranks(2, rank, CFG)[0]
    assert "complex64" in said[0] and "contiguous" in said[1]


def test_auto_stages_only_device_tensors():
    relay = TensorRelay(comm=None, cfg=CFG.replace(stage="auto"))  # type: ignore[arg-type]
    assert relay.staged(torch.ones(1)) is False
    assert relay.staged(torch.ones(1, device="meta")) is True


class FakeEvent:
    """torch.Event's part the copier uses, on the host clock (CPU has no device events)."""

    def __init__(self, device: object = None, *, enable_timing: bool = False) -> None:
        assert enable_timing, "the copier times every copy"
        self.ns = 0
        self.synced = False

    def synchronize(self) -> None:
        self.synced = True

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.ns and end.synced, "timed once the copy is waited on"
        return (end.ns - self.ns) / 1e6


class FakeStream:
    """A copy stream that logs what the copier asks of it."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.inside = False

    def wait_stream(self, other: object) -> None:
        self.log.append(f"wait {other}")

    def record_event(self, event: FakeEvent) -> None:
        event.ns = time.perf_counter_ns()
        self.log.append("record")

    def __enter__(self) -> FakeStream:
        self.inside = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.inside = False


@pytest.mark.timeout(60)
def test_the_device_path_copies_on_its_stream_between_timing_events(monkeypatch):
    """The accelerator path on CPU tensors with stand-ins for torch.Event and the compute
    stream: each copy waits for the caller's stream, runs between two timing events on the
    copy stream, and the relay's results and stage times come out right."""
    monkeypatch.setattr(torch, "Event", FakeEvent)
    monkeypatch.setattr(torch.accelerator, "current_stream", lambda device=None: "compute")
    streams: list[FakeStream] = []

    def rank(comm: Communicator) -> tuple[bytes, bytes, dict[str, int]]:
        stream = FakeStream()
        streams.append(stream)
        relay = Relay(comm, TorchCopier(torch.device("cpu"), stream), CFG)
        x = torch.arange(5000, dtype=torch.float32) * (comm.rank + 1)
        got = relay.all_reduce(x.clone())
        want = comm.all_reduce(x.numpy().copy())
        assert relay.last is not None
        return got.numpy().tobytes(), want.tobytes(), dict(relay.last.stages)

    for got, want, stages in run_ranks(2, rank, CFG):
        assert got == want
        assert set(stages) == {"d2h", "collective", "h2d"} and all(v >= 0 for v in stages.values())
    for stream in streams:
        copies = stream.log.count("wait compute")
        assert copies == 2 * 5  # 5 chunks of 4096 bytes, each in and out
        assert stream.log == ["wait compute", "record", "record"] * copies
