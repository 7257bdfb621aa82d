"""What each wrapped torch.distributed function is called with, read cheaply on every call.

A wrapper must not change the call it wraps, and it must cost microseconds, so arguments are
read by position or keyword from indexes computed once from the function's signature (not
``inspect.Signature.bind``, ~10 µs a call). Anything unexpected (no tensor where one should
be, an argument torch will reject) makes :func:`describe` return None: the wrapper then
calls torch untouched and torch raises its own error.

Sizes follow the runtime and nccl-tests: ``count`` is elements per rank as passed,
``nbytes`` the full gathered buffer for all_gather and reduce_scatter.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: torch.distributed function -> the op name cclctl records (bandwidth.COLLECTIVES).
OPS = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "all_gather_single": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
    "send": "send",
    "recv": "recv",
    "isend": "send",
    "irecv": "recv",
    "barrier": "barrier",
}
_ALWAYS_ASYNC = frozenset({"isend", "irecv"})
_NO_ASYNC = frozenset({"send", "recv"})


@dataclasses.dataclass(slots=True)
class Call:
    """One call as cclctl records it. Ranks are as the caller gave them: ``root``/``peer``
    are global ranks, ``group_root``/``group_peer`` indexes into the group (torch's
    ``group_src``/``group_dst``); the session resolves the latter.
    """

    op: str
    group: Any
    tensor: Any  # a tensor of the call (dtype, device); None for barrier
    count: int
    nbytes: int
    is_async: bool
    root: int | None = None
    group_root: int | None = None
    peer: int | None = None
    group_peer: int | None = None
    direction: str | None = None  # "send" or "recv" for point-to-point


class Args:
    """A function's parameters by name, read from ``(args, kwargs)`` without binding."""

    __slots__ = ("_default", "_index")

    def __init__(self, fn: Callable[..., Any]) -> None:
        params = inspect.signature(fn).parameters
        self._index = {name: i for i, name in enumerate(params)}
        self._default = {
            name: None if p.default is inspect.Parameter.empty else p.default
            for name, p in params.items()
        }

    def get(self, args: Sequence[Any], kwargs: Mapping[str, Any], name: str) -> Any:
        i = self._index.get(name)
        if i is not None and i < len(args):
            return args[i]
        return kwargs.get(name, self._default.get(name))


Describe = Callable[[Sequence[Any], Mapping[str, Any]], "Call | None"]
Get = Callable[[str], Any]

#: Where each function keeps the root or peer: (global name, group-index name).
_RANKS = {
    "broadcast": ("src", "group_src"),
    "reduce": ("dst", "group_dst"),
    "send": ("dst", "group_dst"),
    "isend": ("dst", "group_dst"),
    "recv": ("src", "group_src"),
    "irecv": ("src", "group_src"),
}


def _sizes(name: str, get: Get, tensor_type: type) -> tuple[Any, int, int] | None:
    """(a tensor of the call, count, nbytes), or None when the arguments are not tensors."""

    def tensor(field: str) -> Any:
        value = get(field)
        if not isinstance(value, tensor_type):
            raise TypeError(field)
        return value

    def nbytes(t: Any) -> int:
        return int(t.numel() * t.element_size())

    try:
        if name in ("all_gather", "reduce_scatter"):
            listed = get("tensor_list" if name == "all_gather" else "input_list")
            t = tensor("tensor" if name == "all_gather" else "output")
            if not isinstance(listed, list | tuple):
                return None
            return t, t.numel(), nbytes(t) * len(listed)
        if name in ("all_gather_single", "all_gather_into_tensor"):
            t, out = tensor("input_tensor"), tensor("output_tensor")
            return t, t.numel(), nbytes(out)
        if name in ("reduce_scatter_single", "reduce_scatter_tensor"):
            out, t = tensor("output"), tensor("input")
            return out, out.numel(), nbytes(t)
        if name == "all_to_all_single":
            t = tensor("input")
            return t, t.numel(), nbytes(t)
        if name == "all_to_all":
            ins = get("input_tensor_list")
            if not isinstance(ins, list | tuple) or not ins:
                return None
            if not all(isinstance(t, tensor_type) for t in ins):
                return None
            return ins[0], sum(t.numel() for t in ins), sum(nbytes(t) for t in ins)
        if name == "barrier":
            return None, 0, 0
        t = tensor("tensor")
        return t, t.numel(), nbytes(t)
    except TypeError:
        return None


def describer(name: str, fn: Callable[..., Any], tensor_type: type) -> Describe:
    """The function that reads one call of ``fn`` (torch.distributed's ``name``)."""
    a = Args(fn)
    op = OPS[name]
    ranks = _RANKS.get(name)

    def read(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Call | None:
        def get(field: str) -> Any:
            return a.get(args, kwargs, field)

        sizes = _sizes(name, get, tensor_type)
        if sizes is None:
            return None
        if name in _ALWAYS_ASYNC:
            is_async = True
        else:
            is_async = False if name in _NO_ASYNC else bool(get("async_op"))
        call = Call(op, get("group"), sizes[0], sizes[1], sizes[2], is_async)
        if ranks is not None:
            given, in_group = get(ranks[0]), get(ranks[1])
            if op in ("send", "recv"):
                call.peer, call.group_peer, call.direction = given, in_group, op
            else:
                call.root, call.group_root = given, in_group
        return call

    return read
