"""The relay for torch tensors: a :class:`~cclctl.runtime.relay.copier.Copier` over torch's
device-generic stream and event API, and :class:`TensorRelay`, the collectives of one
communicator on tensors of any device torch can copy to the host.

On an accelerator (``torch.accelerator``: CUDA, XPU, MPS, or any other backend torch
exposes there) the copies run ``non_blocking`` on a copy stream of the device's own
(``torch.Stream``) into page-locked staging buffers (``pin_memory``), each bracketed by two
timing events (``torch.Event(enable_timing=True)``), so the device times them and they
overlap the host collective; the copy stream first waits for the stream the caller's work
runs on, so a copy never reads a tensor before it is written. No CUDA-only call is made.
A CPU tensor (``CCLCTL_STAGE=always``) is copied at once, timed on the host.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from cclctl.config import RuntimeConfig
from cclctl.errors import InvalidArgument
from cclctl.runtime.comm.communicator import Communicator
from cclctl.runtime.relay.copier import CopyEvent, DoneCopy
from cclctl.runtime.relay.relay import Relay, is_staged


class TorchCopy:
    """A copy on a device stream, between a start and an end event."""

    __slots__ = ("end", "start")

    def __init__(self, start: torch.Event, end: torch.Event) -> None:
        self.start, self.end = start, end

    def wait(self) -> None:
        self.end.synchronize()

    def elapsed_ns(self) -> int:
        return int(self.start.elapsed_time(self.end) * 1e6)


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype the relay can stage; bfloat16 is ml_dtypes' (the
    ``bf16`` extra), the dtype cclctl's runtime reduces bfloat16 in."""
    if dtype == torch.bfloat16:
        try:
            import ml_dtypes
        except ImportError:
            raise InvalidArgument(
                "the relay stages bfloat16 tensors with the ml_dtypes package "
                "(pip install cclctl[bf16])"
            ) from None
        return np.dtype(ml_dtypes.bfloat16)
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:
        raise InvalidArgument(
            f"the relay stages tensors numpy can hold; {dtype} is not one (cast it first)"
        ) from None


def _as_tensor(host: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """``host``'s memory as a tensor of ``dtype`` (by its bytes: torch reads no ml_dtypes)."""
    return torch.from_numpy(host.view(np.uint8)).view(dtype)


class TorchCopier:
    """Copies between flat tensors on ``device`` and host staging buffers, on ``stream``
    (default: a new stream of an accelerator device; none for a CPU one)."""

    def __init__(self, device: torch.device, stream: torch.Stream | None = None) -> None:
        self.device = device
        on_accelerator = device.type != "cpu"
        if stream is None and on_accelerator:
            stream = torch.Stream(device=device)
        #: the copy stream (None: copies run at once)
        self.stream = stream
        self._pinned = on_accelerator and torch.accelerator.is_available()
        self._staging: list[torch.Tensor] = []  # the buffers numpy views borrow

    def describe(self, buf: Any) -> tuple[int, np.dtype]:
        return buf.numel(), numpy_dtype(buf.dtype)

    def staging(self, nbytes: int) -> np.ndarray:
        buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self._pinned)
        self._staging.append(buf)
        return buf.numpy()

    def to_host(self, src: Any, offset: int, host: np.ndarray) -> CopyEvent:
        return self._copy(_as_tensor(host, src.dtype), src[offset : offset + host.size])

    def to_device(self, host: np.ndarray, dst: Any, offset: int) -> CopyEvent:
        return self._copy(dst[offset : offset + host.size], _as_tensor(host, dst.dtype))

    def _copy(self, dst: torch.Tensor, src: torch.Tensor) -> CopyEvent:
        stream = self.stream
        if stream is None:
            t0 = time.perf_counter_ns()
            dst.copy_(src)
            return DoneCopy(time.perf_counter_ns() - t0)
        stream.wait_stream(torch.accelerator.current_stream(self.device))
        start = torch.Event(self.device, enable_timing=True)
        end = torch.Event(self.device, enable_timing=True)
        with stream:
            stream.record_event(start)
            dst.copy_(src, non_blocking=True)
            stream.record_event(end)
        return TorchCopy(start, end)


class TensorRelay:
    """The collectives of ``comm`` on torch tensors staged through host memory, one
    :class:`Relay` (and staging ring) per device; :meth:`staged` says which tensors go
    through it under ``CCLCTL_STAGE``."""

    def __init__(self, comm: Communicator, cfg: RuntimeConfig | None = None) -> None:
        self.comm = comm
        self.cfg = cfg or comm.cfg
        self._relays: dict[torch.device, Relay] = {}

    def staged(self, *tensors: torch.Tensor) -> bool:
        """Whether a call on ``tensors`` is relayed (``CCLCTL_STAGE=never`` refuses a device
        tensor)."""
        return is_staged(self.cfg, all(t.device.type == "cpu" for t in tensors))

    def relay(self, device: torch.device) -> Relay:
        relay = self._relays.get(device)
        if relay is None:
            relay = self._relays[device] = Relay(self.comm, TorchCopier(device), self.cfg)
        return relay

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        self.relay(tensor.device).all_reduce(_flat(tensor), op)
        return tensor

    def broadcast(self, tensor: torch.Tensor, root: int = 0) -> torch.Tensor:
        self.relay(tensor.device).broadcast(_flat(tensor), root)
        return tensor

    def reduce(self, tensor: torch.Tensor, op: str = "sum", root: int = 0) -> torch.Tensor:
        self.relay(tensor.device).reduce(_flat(tensor), op, root)
        return tensor

    def all_gather(self, tensor: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        self.relay(tensor.device).all_gather(_flat(tensor), _flat(out, tensor.device))
        return out

    def reduce_scatter(
        self, tensor: torch.Tensor, out: torch.Tensor, op: str = "sum"
    ) -> torch.Tensor:
        self.relay(tensor.device).reduce_scatter(_flat(tensor), _flat(out, tensor.device), op)
        return out

    def all_to_all(self, tensor: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        self.relay(tensor.device).all_to_all(_flat(tensor), _flat(out, tensor.device))
        return out


def _flat(tensor: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """A flat view of a contiguous tensor (on ``device``, where one is named)."""
    if not tensor.is_contiguous():
        raise InvalidArgument("the relay stages contiguous tensors only")
    if device is not None and tensor.device != device:
        raise InvalidArgument(f"out is on {tensor.device}, the input on {device}")
    return tensor.view(-1)
