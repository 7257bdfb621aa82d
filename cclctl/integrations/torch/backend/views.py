"""Torch tensors as the flat numpy arrays cclctl's runtime takes, and its reductions' names.

A tensor a collective runs on in host memory goes through :func:`host_view`, which says
how it gets there. A contiguous CPU tensor is viewed in place (``tensor.numpy()``:
zero-copy, the runtime reads and writes the tensor's own storage); a non-contiguous one is
copied into a contiguous buffer, and an output copied back once the call ends. With
``whole`` (a tensor :mod:`.relayed` stages whole: a device tensor, or any tensor under
``CCLCTL_STAGE=always``) the tensor is copied into a host buffer when the call is issued and
the result copied back when it ends. A device tensor without ``whole`` is refused: which
tensors are staged, and how, is :mod:`.relayed`'s decision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
import torch
import torch.distributed as dist

from cclctl.errors import InvalidArgument

#: torch's reductions by cclctl's names (AVG runs as the runtime's ``avg``: a sum divided
#: by the group's size once, at the end, as NCCL's; integer tensors divide with truncation)
REDUCE_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.AVG: "avg",
}
#: dtypes the runtime does not reduce: moved as their bytes by the calls that only move data
#: (bfloat16 reduces where the optional ml_dtypes package gives numpy that type)
_BYTES_ONLY = {torch.bfloat16, torch.bool, torch.complex64, torch.complex128}
#: dtypes whose tensor ``.numpy()`` views as itself (the fast path of :func:`host_view`)
_NUMPY_NATIVE = {
    torch.float16, torch.float32, torch.float64, torch.uint8, torch.int8, torch.int16,
    torch.int32, torch.int64,
}  # fmt: skip
#: the reductions by their ``RedOpType``'s value (a dict lookup: comparing torch's
#: ``ReduceOp`` objects one by one costs a microsecond a call)
_BY_VALUE = {int(op.value): name for op, name in REDUCE_OPS.items()}


@dataclasses.dataclass(slots=True)
class HostView:
    """A tensor as a flat numpy array; ``staged``: the contiguous copy the array views,
    written back into the tensor once the call ends (None: the array is the tensor's own
    memory)."""

    tensor: torch.Tensor
    array: np.ndarray
    staged: torch.Tensor | None = None

    @property
    def copied(self) -> bool:
        return self.staged is not None

    def write_back(self) -> None:
        """Copy the call's result into the tensor, when the array is a copy."""
        if self.staged is not None:
            self.tensor.copy_(self.staged)


def redop(op: object, call: str) -> str:
    """cclctl's name for torch's reduction ``op`` (a ``ReduceOp`` or its ``RedOpType``)."""
    name = _BY_VALUE.get(getattr(getattr(op, "op", op), "value", -1))
    if name is not None:
        return name
    raise InvalidArgument(
        f"{call}: reduction {op} is not one cclctl's runtime runs; use SUM, PRODUCT, MIN, "
        "MAX or AVG",
        op=call,
    )


def host_views(tensors: Iterable[torch.Tensor], call: str, *, reduces: bool) -> list[HostView]:
    """Each CPU tensor as host memory the runtime can use (``reduces``: the call does
    arithmetic on it, so its dtype must be one numpy has). A non-CPU tensor is refused."""
    return [host_view(t, call, reduces) for t in tensors]


def host_view(tensor: torch.Tensor, call: str, reduces: bool, whole: bool = False) -> HostView:
    """``tensor`` as a flat numpy array (``whole``: a copy in host memory, made now and
    written back once the call ends, whatever device the tensor is on)."""
    if not whole and tensor.is_cpu and tensor.dtype in _NUMPY_NATIVE and tensor.is_contiguous():
        flat = tensor if tensor.dim() == 1 else tensor.view(-1)  # the common case, fast
        return HostView(tensor, (flat.detach() if flat.requires_grad else flat).numpy())
    if tensor.device.type != "cpu" and not whole:
        raise InvalidArgument(
            f"{call}: a tensor on {tensor.device} reached cclctl's host views unstaged; "
            "device tensors go through the relay (host staging: CCLCTL_STAGE=auto or "
            "always), or use backend='cpu:cclctl,cuda:nccl'",
            op=call,
        )
    data = tensor.detach()
    staged: torch.Tensor | None = None
    if whole:
        staged = data.to("cpu", memory_format=torch.contiguous_format, copy=True)
    elif not data.is_contiguous():
        staged = data.contiguous()
    flat = (data if staged is None else staged).reshape(-1)  # a view of either
    if flat.dtype == torch.bfloat16 and (bf16 := _numpy_bfloat16()) is not None:
        return HostView(tensor, flat.view(torch.int16).numpy().view(bf16), staged)
    if flat.dtype in _BYTES_ONLY:
        if reduces:
            raise not_reduced(tensor, call)
        flat = flat.view(torch.uint8)
    return HostView(tensor, flat.numpy(), staged)


def _numpy_bfloat16() -> np.dtype | None:
    """numpy's bfloat16 from ml_dtypes (the bits of torch's), or None without it."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def not_reduced(tensor: torch.Tensor, call: str) -> InvalidArgument:
    """The error of a reduction on a tensor whose dtype the runtime moves only as bytes."""
    return InvalidArgument(
        f"{call}: cclctl's runtime does not reduce {tensor.dtype} tensors; use a "
        "float or integer dtype (bfloat16 needs the ml_dtypes package: cclctl[bf16])",
        op=call,
    )
