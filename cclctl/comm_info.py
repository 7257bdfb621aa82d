"""A communicator as a rank's document names it: its members and how far the rank got.

Part of the dump and status schema (:mod:`cclctl.records`); parsed here from untrusted JSON,
with the members folded (``"0-4095"``) and bounded. Standard library only.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from cclctl import limits
from cclctl.errors import BadInput, UsageError
from cclctl.ranges import fold_ranks, parse_ranks


def _fail(where: str, why: str) -> BadInput:
    return BadInput(f"{where}: {why}", where=where)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(slots=True)
class CommInfo:
    """What a rank knows about one communicator: members and how far it got.

    In JSON the members are folded (``"0-4095"``): every rank's status repeats them, and a
    list of 10,000 integers in each of 10,000 statuses would be most of what a reader parses.
    Parsed member lists are shared between snapshots: readers must not modify them.
    """

    ranks: list[int]
    last_started: int = 0
    last_completed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": fold_ranks(self.ranks),
            "last_started": self.last_started,
            "last_completed": self.last_completed,
        }


#: Members one document may name over all its communicators: the world and a few groups.
MAX_MEMBERS = 4 * limits.MAX_WORLD_SIZE


@functools.lru_cache(maxsize=1024)
def _members(folded: str) -> list[int] | None:
    try:
        return parse_ranks(folded, limits.MAX_WORLD_SIZE)
    except UsageError:
        return None


def clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def comms_from_dict(data: object, where: str) -> dict[str, CommInfo]:
    if not isinstance(data, Mapping):
        raise _fail(where, "field 'comms' must be an object")
    comms: dict[str, CommInfo] = {}
    members = 0
    for name, info in data.items():
        raw = info.get("ranks") if isinstance(info, Mapping) else None
        label = clip(str(name))
        if isinstance(raw, str):
            ranks = _members(raw)
            if ranks is None:
                raise _fail(
                    where,
                    f"communicator {label!r} has members {clip(raw)!r}, not like 0-3,7 "
                    f"(below {limits.MAX_WORLD_SIZE:,})",
                )
        elif isinstance(raw, list) and set(map(type, raw)) <= {int}:  # older writers: a list
            ranks = list(raw)
            if ranks and not 0 <= min(ranks) <= max(ranks) < limits.MAX_WORLD_SIZE:
                outside = f"outside 0-{limits.MAX_WORLD_SIZE - 1}"
                raise _fail(where, f"communicator {label!r} has a member {outside}")
        else:
            raise _fail(where, f"communicator {label!r} has no list of ranks")
        assert isinstance(info, Mapping)
        started = info.get("last_started", 0)
        completed = info.get("last_completed", 0)
        if not _is_int(started) or not _is_int(completed):
            raise _fail(where, f"communicator {name!r} has non-integer fields")
        members += len(ranks)
        if members > MAX_MEMBERS:  # folded ranges are short: bound what they expand to
            raise limits.TooLarge(
                f"{where}: its communicators name over {MAX_MEMBERS:,} members in all",
                where=where,
            )
        comms[str(name)] = CommInfo(ranks, started, completed)
    return comms
