"""A torch.distributed call as cclctl records it: its process group's communicator, its
dtype's name and size, the text of torch's exception, and how its record ends."""

from __future__ import annotations

from typing import Any

from cclctl.ranges import fold_ranks
from cclctl.records import COMPLETED, FAILED, TIMED_OUT, CollectiveRecord

_DTYPES: dict[Any, tuple[str, int]] = {}


def dtype_info(dtype: Any) -> tuple[str, int]:
    """``torch.float32`` -> ``("float32", 4)``: its name and bytes per element, cached
    (``str()`` of a dtype costs several times a dict hit, on every general-path call)."""
    info = _DTYPES.get(dtype)
    if info is None:
        info = _DTYPES[dtype] = (str(dtype).removeprefix("torch."), dtype.itemsize)
    return info


def error_text(error: BaseException) -> str:
    """What a record says of torch's exception: its type and first line."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def finish_record(rec: CollectiveRecord, error: str | None, end_ns: int) -> None:
    """End ``rec`` at ``end_ns``: completed, or failed with ``error`` (a timed-out record
    stays timed out). ``end_ns`` is set last: telemetry takes a record with it as ended.
    """
    if error is None:
        rec.state = COMPLETED
        rec.waiting_on = rec.waiting_for = None
    else:
        if rec.state != TIMED_OUT:
            rec.state = FAILED
        rec.error = error
    rec.end_ns = end_ns


class TorchComm:
    """A process group as cclctl counts it: id ``<group name>:<folded member ranks>``, its
    collective seq and, per peer, the seq of point-to-point calls each way."""

    __slots__ = ("group", "id", "name", "ranks", "received", "sent", "seq", "size")

    def __init__(self, group: Any, name: str, ranks: list[int]) -> None:
        self.group = group
        self.name = name  # torch's group name (``pg_name``)
        self.ranks = ranks
        self.size = len(ranks)
        self.id = f"{name}:{fold_ranks(ranks)}"
        self.seq = 0
        self.sent: dict[int, int] = {}
        self.received: dict[int, int] = {}

    def global_rank(self, given: int | None, in_group: int | None) -> int | None:
        """A root or peer as a global rank, from torch's ``src`` or ``group_src`` form."""
        if given is not None:
            return int(given)
        if in_group is not None and 0 <= in_group < self.size:
            return self.ranks[in_group]
        return None
