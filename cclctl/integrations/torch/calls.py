"""What each process-group method is called with, read into a :class:`Call`.

The wrapper process group (:mod:`~cclctl.integrations.torch.traced`) sees every collective
as the c10d ``ProcessGroup`` method that torch's Python API, DDP's reducer, FSDP and the
functional collectives all end in: ``allreduce(tensors, opts)``, ``_allgather_base(out,
in, opts)``, ``send(tensors, dst, tag)``, ... Anything unexpected (no tensor where one
should be) makes the reader return None: the call then goes to torch untouched and torch
raises its own error.

Sizes follow the runtime and nccl-tests: ``count`` is elements per rank as passed,
``nbytes`` the full gathered buffer for all_gather and reduce_scatter. Roots and peers are
indexes into the group (``opts.rootRank``, ``dstRank``); the session maps them to global ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

#: process-group method -> (op cclctl records, how its sizes are read); torch 2.13's names
#: (``all_gather_single``, ...) and older torch's (``_allgather_base``, ...) alike.
#: Layouts: ``one``: the tensors of the first argument; ``gathered``: the first argument
#: is the gathered output, the second the input; ``scattered``: the first is the output,
#: the second the full input; ``input``: the second argument is the input; ``root``: like
#: ``one``, with the root in ``opts.rootRank``; ``p2p``: the tensors and the peer;
#: ``none``: no tensor.
METHODS: dict[str, tuple[str, str]] = {
    "allreduce": ("all_reduce", "one"),
    "allreduce_coalesced": ("all_reduce", "one"),
    "broadcast": ("broadcast", "root"),
    "reduce": ("reduce", "root"),
    "allgather": ("all_gather", "gathered"),
    "all_gather_single": ("all_gather", "gathered"),
    "_allgather_base": ("all_gather", "gathered"),
    "allgather_coalesced": ("all_gather", "gathered"),
    "all_gather_single_coalesced": ("all_gather", "gathered"),
    "allgather_into_tensor_coalesced": ("all_gather", "gathered"),
    "reduce_scatter": ("reduce_scatter", "scattered"),
    "reduce_scatter_single": ("reduce_scatter", "scattered"),
    "_reduce_scatter_base": ("reduce_scatter", "scattered"),
    "reduce_scatter_single_coalesced": ("reduce_scatter", "scattered"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", "scattered"),
    "alltoall": ("all_to_all", "input"),
    "all_to_all_single": ("all_to_all", "input"),
    "alltoall_base": ("all_to_all", "input"),
    "barrier": ("barrier", "none"),
    "send": ("send", "p2p"),
    "recv": ("recv", "p2p"),
    "recv_anysource": ("recv", "p2p"),
}


class Call:
    """One call as cclctl records it: ``group_root``/``group_peer`` index the group."""

    __slots__ = ("count", "direction", "group_peer", "group_root", "nbytes", "op", "tensor")

    def __init__(self, op: str, tensor: Any, count: int, nbytes: int) -> None:
        self.op = op
        self.tensor = tensor  # a tensor of the call (dtype, device); None for barrier
        self.count = count
        self.nbytes = nbytes
        self.group_root: int | None = None
        self.group_peer: int | None = None
        self.direction: str | None = None  # "send" or "recv" for point-to-point


Describe = Callable[[Sequence[Any]], "Call | None"]


def _tensors(value: Any, tensor: type) -> list[Any] | None:
    """Every tensor of an argument: a tensor, a list of them, or a list of lists."""
    if isinstance(value, tensor):
        return [value]
    if not isinstance(value, list | tuple) or not value:
        return None
    flat: list[Any] = []
    for item in value:
        if isinstance(item, tensor):
            flat.append(item)
        elif isinstance(item, list | tuple) and all(isinstance(x, tensor) for x in item):
            flat.extend(item)
        else:
            return None
    return flat or None


def _size(tensors: list[Any]) -> tuple[int, int]:
    count = sum(t.numel() for t in tensors)
    return count, sum(t.numel() * t.element_size() for t in tensors)


def describer(method: str, tensor_type: type) -> Describe:
    """The function that reads one call of the process-group method ``method``:
    ``read(args)`` -> :class:`Call`, or None for arguments torch will reject.
    """
    op, layout = METHODS[method]
    single = layout in ("one", "root")  # sizes read from the first argument alone

    def read(args: Sequence[Any]) -> Call | None:
        if layout == "none":
            return Call(op, None, 0, 0)
        if single and args:
            only = args[0]
            if type(only) is list and len(only) == 1 and type(only[0]) is tensor_type:
                tensor: Any = only[0]  # the usual call (DDP's buckets, the Python API)
                count = tensor.numel()  # not ``nbytes``: sparse tensors have none
                call = Call(op, tensor, count, count * tensor.element_size())
                if layout == "root":
                    call.group_root = _root(args)
                return call
        first = _tensors(args[0], tensor_type) if args else None
        if first is None:
            return None
        count, nbytes = _size(first)
        tensor = first[0]
        if layout in ("gathered", "scattered", "input"):
            second = _tensors(args[1], tensor_type) if len(args) > 1 else None
            if second is None:
                return None
            n2, b2 = _size(second)
            if layout == "gathered":  # count: the input per rank; bytes: the gathered output
                count = n2
            elif layout == "input":  # all_to_all: the input, as passed
                count, nbytes, tensor = n2, b2, second[0]
            else:  # scattered: count is the output per rank, bytes the full input
                nbytes = b2
        call = Call(op, tensor, count, nbytes)
        if layout == "root":
            call.group_root = _root(args)
        elif layout == "p2p":
            call.direction = op
            peer = args[1] if len(args) > 1 and method != "recv_anysource" else None
            call.group_peer = peer if isinstance(peer, int) else None
        return call

    return read


def _root(args: Sequence[Any]) -> int | None:
    """``opts.rootRank``, or the root given by position (``broadcast(tensor, root)``)."""
    if len(args) < 2:
        return 0
    opts = args[1]
    if isinstance(opts, int) and not isinstance(opts, bool):
        return opts
    root = getattr(opts, "rootRank", None)
    return root if isinstance(root, int) else None
