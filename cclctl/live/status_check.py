"""A rank's status from its text, checked beyond the schema: the fields a view reads must be
usable. A status that is not is that rank's problem (:class:`BadInput`, said in words),
never its job's; one stating a size beyond :mod:`cclctl.limits` raises TooLarge, for the
whole job, since every reader would allocate by it.
"""

from __future__ import annotations

import json
from typing import Any

from cclctl import limits
from cclctl.errors import BadInput
from cclctl.records import RankSnapshot, snapshot_from_dict
from cclctl.status_digest import digest

_WHERE = "status"


def parse_one(
    text: str, rank: int, keyed: bool = True
) -> tuple[RankSnapshot | BadInput, str | None]:
    """Rank ``rank``'s status from a host document, or why it is unusable; and, where
    ``keyed``, its digest's key (:mod:`cclctl.status_digest`; None: it has none). A size
    beyond :mod:`cclctl.limits` raises TooLarge, for the whole job."""
    try:
        data = decoded(text)  # a host document's status is text already
        snap = checked(data, rank)
    except limits.TooLarge as exc:
        raise limits.TooLarge(f"status of rank {rank}: {unprefixed(exc)}") from None
    except BadInput as exc:
        return exc, None
    row = digest(data) if keyed else None
    return snap, None if row is None else row[2]  # the key (its text's hash is not needed)


def unprefixed(exc: BadInput) -> str:
    return exc.message.removeprefix(_WHERE + ": ")


def status(value: bytes, rank: int) -> RankSnapshot:
    """A rank's status, checked beyond the schema: the fields a view reads must be usable."""
    return checked(decoded(value), rank)


def decoded(value: str | bytes) -> Any:
    where = _WHERE
    try:
        return json.loads(value)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadInput(f"{where}: not valid JSON ({exc})", where=where) from None
    except RecursionError:
        raise BadInput(f"{where}: JSON nested too deeply", where=where) from None


def checked(data: Any, rank: int) -> RankSnapshot:
    """A rank's status from its decoded document (its own key's, or its host agent's)."""
    where = _WHERE
    if not isinstance(data, dict):
        raise BadInput(f"{where}: not a JSON object", where=where)
    snap = snapshot_from_dict(data, where)
    if snap.rank != rank:
        raise BadInput(f"{where}: the document says it is rank {snap.rank}", where=where)
    if snap.kind != "status":
        raise BadInput(f"{where}: a {snap.schema} document, not a status", where=where)
    for name in ("collectives", "errors", "retries", "hangs"):
        count = snap.counters.get(name, 0)
        if not isinstance(count, int) or isinstance(count, bool):
            raise BadInput(f"{where}: counter {name!r} is not an integer", where=where)
    busbw = snap.counters.get("last_busbw_gbps", {})
    if not isinstance(busbw, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in busbw.values()
    ):
        raise BadInput(f"{where}: 'last_busbw_gbps' is not a map of numbers", where=where)
    return snap
