"""What each wrapped torch.distributed function is called with, read cheaply on every call.

A wrapper must not change the call it wraps, and it runs on every call, so arguments are
read by position or keyword from indexes computed once from the function's signature
(``inspect.Signature.bind`` on every call would cost more than the rest of the wrapper).
Anything unexpected (no tensor where one should be, an argument torch will reject) makes the
reader return None: the wrapper then calls torch untouched and torch raises its own error.

Sizes follow the runtime and nccl-tests: ``count`` is elements per rank as passed,
``nbytes`` the full gathered buffer for all_gather and reduce_scatter.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

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


class Call:
    """One call as cclctl records it. Ranks are as the caller gave them: ``root``/``peer``
    are global ranks, ``group_root``/``group_peer`` indexes into the group (torch's
    ``group_src``/``group_dst``); the session resolves the latter.
    """

    __slots__ = (
        "count",
        "direction",
        "group",
        "group_peer",
        "group_root",
        "is_async",
        "nbytes",
        "op",
        "peer",
        "root",
        "tensor",
    )

    def __init__(
        self, op: str, group: Any, tensor: Any, count: int, nbytes: int, is_async: bool
    ) -> None:
        self.op = op
        self.group = group
        self.tensor = tensor  # a tensor of the call (dtype, device); None for barrier
        self.count = count
        self.nbytes = nbytes
        self.is_async = is_async
        self.root: int | None = None
        self.group_root: int | None = None
        self.peer: int | None = None
        self.group_peer: int | None = None
        self.direction: str | None = None  # "send" or "recv" for point-to-point


Describe = Callable[[Sequence[Any], Mapping[str, Any]], "Call | None"]

#: How each function's sizes are read: a layout and the parameters holding the tensors.
#: one: count and bytes of one tensor; gathered/scattered: the other tensor's bytes are
#: the full buffer; *_list: the list's length times the tensor; lists: a list of tensors.
_LAYOUTS: dict[str, tuple[str, str, str]] = {
    "all_gather": ("gathered_list", "tensor", "tensor_list"),
    "all_gather_single": ("gathered", "input_tensor", "output_tensor"),
    "all_gather_into_tensor": ("gathered", "input_tensor", "output_tensor"),
    "reduce_scatter": ("scattered_list", "output", "input_list"),
    "reduce_scatter_single": ("scattered", "output", "input"),
    "reduce_scatter_tensor": ("scattered", "output", "input"),
    "all_to_all_single": ("one", "input", ""),
    "all_to_all": ("lists", "input_tensor_list", ""),
    "barrier": ("none", "", ""),
}

#: Where each function keeps the root or peer: (global name, group-index name).
_RANKS = {
    "broadcast": ("src", "group_src"),
    "reduce": ("dst", "group_dst"),
    "send": ("dst", "group_dst"),
    "isend": ("dst", "group_dst"),
    "recv": ("src", "group_src"),
    "irecv": ("src", "group_src"),
}

_ABSENT = 1 << 30  # the position of a parameter this torch's function does not have


def _positions(fn: Callable[..., Any]) -> Callable[[str], int]:
    """A parameter's position in ``fn``'s signature, or ``_ABSENT``."""
    params = list(inspect.signature(fn).parameters)
    return lambda param: params.index(param) if param in params else _ABSENT


class QuickLayout(NamedTuple):
    """Where a one-tensor collective without a root or peer keeps its tensor, group and
    ``async_op`` (positions in the signature, or ``_ABSENT``), so the wrapper can read its
    common call (synchronous, CPU) inline, without a :class:`Call`.
    """

    i_tensor: int
    tensor: str
    i_group: int
    i_async: int


def quick_layout(name: str, fn: Callable[..., Any]) -> QuickLayout | None:
    """The quick layout of ``name`` (all_reduce, all_to_all_single), or None when its calls
    need the general reader (several tensors, a root or peer, always asynchronous).
    """
    layout, first, _ = _LAYOUTS.get(name, ("one", "tensor", ""))
    if layout != "one" or name in _RANKS or name in _ALWAYS_ASYNC:
        return None
    at = _positions(fn)
    if at(first) == _ABSENT:
        return None
    return QuickLayout(at(first), first, at("group"), at("async_op"))


def describer(name: str, fn: Callable[..., Any], tensor_type: type) -> Describe:
    """The function that reads one call of ``fn`` (torch.distributed's ``name``).

    Parameter positions are looked up once here, not on every call. The returned function
    returns None when the arguments are not what torch expects.
    """
    at = _positions(fn)
    op = OPS[name]
    layout, first, second = _LAYOUTS.get(name, ("one", "tensor", ""))
    i_first, i_second, i_group, i_async = at(first), at(second), at("group"), at("async_op")
    given, in_group = _RANKS.get(name, ("", ""))
    i_given, i_in_group = at(given), at(in_group)
    always, never = name in _ALWAYS_ASYNC, name in _NO_ASYNC
    tensor: Any = tensor_type

    def read(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Call | None:
        n = len(args)
        a = args[i_first] if i_first < n else kwargs.get(first)
        if layout == "none":
            t, count, nbytes = None, 0, 0
        elif layout == "lists":
            if not isinstance(a, list | tuple) or not a:
                return None
            if not all(isinstance(x, tensor) for x in a):
                return None
            t, count = a[0], sum(x.numel() for x in a)
            nbytes = sum(x.numel() * x.element_size() for x in a)
        else:
            if not isinstance(a, tensor):
                return None
            t, count = a, a.numel()
            nbytes = count * a.element_size()
            if layout != "one":
                b = args[i_second] if i_second < n else kwargs.get(second)
                if layout.endswith("_list"):
                    if not isinstance(b, list | tuple):
                        return None
                    nbytes *= len(b)
                elif isinstance(b, tensor):  # the gathered output, or the scattered input
                    nbytes = b.numel() * b.element_size()
                else:
                    return None
        group = args[i_group] if i_group < n else kwargs.get("group")
        if always:
            is_async = True
        elif never:
            is_async = False
        else:
            is_async = bool(args[i_async] if i_async < n else kwargs.get("async_op"))
        call = Call(op, group, t, count, nbytes, is_async)
        if given:
            rank = args[i_given] if i_given < n else kwargs.get(given)
            index = args[i_in_group] if i_in_group < n else kwargs.get(in_group)
            if op == "send" or op == "recv":
                call.peer, call.group_peer, call.direction = rank, index, op
            else:
                call.root, call.group_root = rank, index
        return call

    return read
