"""Which way a call's tensors reach cclctl's runtime: the one place the backend decides.

A tensor is *staged* where ``CCLCTL_STAGE``'s rule
(:func:`~cclctl.runtime.relay.relay.is_staged`) says so: under ``auto`` (the default) a
tensor on any device but the CPU, under ``always`` every tensor; ``never`` refuses a device
tensor in words. A call none of whose tensors is staged keeps the host path: zero-copy
numpy views of CPU tensors (:mod:`.views`). A staged call runs one of two ways:

- **Through the relay**: ``all_reduce`` (and its coalesced form), ``broadcast``,
  ``reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor`` (and their coalesced
  forms) and ``all_to_all_single`` without splits. The group's
  :class:`~cclctl.integrations.torch.relay_copier.TensorRelay` (one per process group, made
  on its first staged call, on the group's communicator) takes the communicator's place in
  :mod:`.ops`: the tensor is cut into chunks staged through a fixed ring of page-locked
  buffers, pipelined, and each call is one record on ``<comm>/relay`` whose ``stages`` time
  d2h, the host collectives and h2d. It runs on the group's progress thread, as every call,
  in issue order; the device tensor is read and written there (a non-contiguous one through
  a contiguous copy on its device, written back once the call ends).
- **Staged whole**: the list forms of ``all_gather``, ``reduce_scatter`` and
  ``all_to_all``, ``gather``, ``scatter``, ``all_to_all_single`` with splits,
  ``send`` and ``recv``. Each tensor is copied into a host buffer of its own size when the
  call is issued and the output copied back to its device when the call ends; the runtime
  runs the host path's call on the copies (its records are the host path's, with no
  stages). These calls are the ones DDP and FSDP do not make per step.

Every rank of a group must take the same way for a call, since a relayed call is a run of
chunk calls on the communicator: a job whose ranks mix device and CPU tensors sets
``CCLCTL_STAGE=always`` on its CPU ranks (or on every rank); one left on ``auto`` fails a
call larger than a staging chunk with the runtime's collective mismatch (the chunk calls
meet the whole one), never with a wrong result. A call whose tensors sit on
different devices is refused when it is issued (the relay stages from one device).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from cclctl.config import RuntimeConfig
from cclctl.errors import InvalidArgument
from cclctl.integrations.torch.backend.ops import Collectives, View
from cclctl.integrations.torch.backend.views import HostView, host_view, not_reduced
from cclctl.integrations.torch.relay_copier import TensorRelay, numpy_dtype
from cclctl.runtime.comm import buffers
from cclctl.runtime.comm.communicator import Communicator
from cclctl.runtime.relay.relay import is_staged


@dataclasses.dataclass
class RelayView:
    """A tensor as the flat tensor the relay runs on; ``staged``: the contiguous copy on
    the tensor's device that ``array`` views, written back once the call ends (None:
    ``array`` is the tensor's own memory)."""

    tensor: torch.Tensor
    array: torch.Tensor
    staged: torch.Tensor | None = None

    def write_back(self) -> None:
        if self.staged is not None:
            self.tensor.copy_(self.staged)


class Placement:
    """One process group's way for each call's tensors: host views, a whole copy, or the
    group's relay (``cfg``: ``CCLCTL_STAGE*``'s values; default: the communicator's)."""

    def __init__(self, comm: Communicator, cfg: RuntimeConfig | None = None) -> None:
        self.comm = comm
        self.cfg = cfg or comm.cfg
        self._relay: TensorRelay | None = None
        self._cpu_stays = self.cfg.stage != "always"  # a CPU tensor keeps the host path

    @property
    def relay(self) -> TensorRelay:
        """The group's relay, made on its first staged call."""
        if self._relay is None:
            self._relay = TensorRelay(self.comm, self.cfg)
        return self._relay

    def _staged(self, tensor: torch.Tensor) -> bool:
        return is_staged(self.cfg, tensor.is_cpu)

    def host(self, tensors: Sequence[torch.Tensor], call: str, *, reduces: bool) -> list[HostView]:
        """Host views for a call the relay does not have: a staged tensor copied whole."""
        return [host_view(t, call, reduces, whole=self._staged(t)) for t in tensors]

    def direct(
        self, tensors: Sequence[torch.Tensor], call: str, *, reduces: bool
    ) -> tuple[Collectives, list[View]]:
        """What runs a call the relay has, and its tensors' views: the relay and flat
        tensors where any of them is staged, else the communicator and host views."""
        if self._cpu_stays and all([t.is_cpu for t in tensors]):
            views: list[View] = [host_view(t, call, reduces) for t in tensors]
            return self.comm, views
        for tensor in tensors:  # a device tensor under CCLCTL_STAGE=never is refused here
            self._staged(tensor)
        devices = sorted({str(t.device) for t in tensors})
        if len(devices) > 1:
            raise InvalidArgument(
                f"{call}: the relay stages a call's tensors from one device; these are on "
                f"{', '.join(devices)}",
                op=call,
            )
        return self.relay, [_relay_view(t, call, reduces) for t in tensors]


def _relay_view(tensor: torch.Tensor, call: str, reduces: bool) -> RelayView:
    """``tensor`` as a flat contiguous tensor the relay stages: dtypes the runtime only
    moves (bool, complex; bfloat16 without ml_dtypes) as their bytes, refused by a
    reduction."""
    data = tensor.detach()
    staged = None if data.is_contiguous() else data.contiguous()
    flat = (data if staged is None else staged).reshape(-1)
    if not _reducible(flat.dtype):
        if reduces:
            raise not_reduced(tensor, call)
        flat = flat.view(torch.uint8)
    return RelayView(tensor, flat, staged)


def _reducible(dtype: torch.dtype) -> bool:
    """Whether the relay stages ``dtype`` as itself (a numpy dtype the runtime holds)."""
    try:
        return buffers.dtype_name(numpy_dtype(dtype)) in buffers.SUPPORTED_DTYPES
    except InvalidArgument:
        return False
