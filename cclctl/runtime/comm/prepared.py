"""What a zero-copy call worked out, kept for the next call with the very same arrays.

Checking a call's arrays and finding them among the shared buffers cost about 60 us of a
4 MiB all_gather here: little work, but everything it touches is cold after the copies. A
training loop passes the same arrays call after call. The same array object with the same
shape, strides, dtype and writeability passes the same checks and lies at the same place in
the same buffer, because shared buffers do not own their memory, so numpy cannot move it.
Only weak references are kept: remembering a call never keeps its buffers alive.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

_Facts = tuple[Any, ...]


def _facts(arr: np.ndarray) -> _Facts:
    return (arr.shape, arr.strides, arr.dtype, arr.flags.writeable)


#: Calls remembered per communicator; a training loop cycles through a few buffers per op
#: (gradient buckets), and an array that dies frees nothing but its entry.
MAX_CALLS = 64


class PreparedCalls:
    """The preparation of recent zero-copy calls of one communicator, by op and arrays."""

    def __init__(self) -> None:
        self._calls: dict[tuple[Any, ...], tuple[tuple[Any, ...], _Facts, Any]] = {}

    def get(self, op: str, *arrays: object) -> Any:
        """What :meth:`keep` stored for ``op`` on these very arrays (``None`` where the
        caller passed none), if they are unchanged since; else None."""
        if not self._calls:  # no zero-copy call yet: plain buffers pay one test
            return None
        last = self._calls.get((op, *map(id, arrays)))
        if last is None:
            return None
        refs, facts, value = last
        for ref, arr, fact in zip(refs, arrays, facts, strict=True):
            if ref is None:
                if arr is not None:
                    return None
            elif ref() is not arr or _facts(arr) != fact:
                return None
        return value

    def keep(self, op: str, arrays: tuple[np.ndarray | None, ...], value: Any) -> None:
        """Remember ``value`` as what a call of ``op`` on ``arrays`` prepared."""
        if len(self._calls) >= MAX_CALLS:
            self._calls.clear()
        refs = tuple(None if a is None else weakref.ref(a) for a in arrays)
        facts = tuple(None if a is None else _facts(a) for a in arrays)
        self._calls[(op, *map(id, arrays))] = (refs, facts, value)
