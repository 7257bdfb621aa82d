"""A rank document's call in flight, validated once where it is also its last record.

A status writes the call it is in twice: as ``inflight`` and as the last of ``records``.
A reader of 100,000 statuses would validate each of them twice; where the two are the same
JSON (equal, and of the same types throughout: ``1``, ``1.0`` and ``true`` are equal in
Python, not to the validation), the in-flight record is a copy of the last record, and
otherwise it is validated on its own, so what is refused stays refused with its message.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TypeVar

#: a record (``records.CollectiveRecord``; this module does not import it)
R = TypeVar("R")


def inflight(
    raw: object, records_raw: Sequence[object], records: Sequence[R], read: Callable[[object], R]
) -> R | None:
    """The call in flight from its JSON ``raw`` (None for none): a shallow copy of the last
    of ``records`` (read from ``records_raw``) where it is the same document, else
    ``read(raw)``."""
    if raw is None:
        return None
    if records and same(raw, records_raw[-1]):
        return copy.copy(records[-1])
    return read(raw)


def same(a: object, b: object) -> bool:
    """Whether two parsed JSON values are equal and of the same types throughout."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same, a, b))
    return a == b
