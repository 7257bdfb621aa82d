"""The facts of a failed call, as fields: how it failed, and which peer or origin it names.

A failed call's record keeps its error in words (``error``) and these facts beside it
(``fault``), so the diagnosis reads who a call waited on, which link broke, where the job's
failure started and what a mismatched peer called from fields, never from the wording. The
facts come from the error's own fields (:attr:`cclctl.errors.CclError.fields`), which each
raise site fills; :func:`fault_of` turns an error into them. Documents written before the
field existed have none: the diagnosis then falls back to the words
(:mod:`cclctl.diagnose.errtext`). Standard library only, like :mod:`cclctl.records`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from cclctl import limits
from cclctl.errors import BadInput, CclError

#: What happened to the call (the error field ``fault`` names one):
#: ``timeout``       it waited on ``peer`` (``direction``: ``send``/``recv``) past its deadline;
#: ``link_broke``    the link to ``peer`` broke while it moved bytes in ``direction``;
#: ``link_dropped``  the link to ``peer`` had been dropped before the call;
#: ``peer_failed``   ``peer`` failed, closed or exited (its end of shared memory says so);
#: ``mismatch``      ``peer`` called ``theirs`` at ``their_seq`` where this rank called ``mine``;
#: ``step_mismatch`` ``peer`` sent another step or size of the same call;
#: ``revoked``       the job's failure, whose ``origin`` is another rank, ended the call;
#: ``aborted``       an operator, a policy or the watchdog aborted the communicator;
#: ``failed``        this rank saw the job's failure itself (``origin`` names whose it is);
#: ``error``         anything else (a local error, a closed communicator, a bug).
TIMEOUT, LINK_BROKE, LINK_DROPPED = "timeout", "link_broke", "link_dropped"
PEER_FAILED, MISMATCH, STEP_MISMATCH = "peer_failed", "mismatch", "step_mismatch"
REVOKED, ABORTED, FAILED, ERROR = "revoked", "aborted", "failed", "error"
KINDS = (
    TIMEOUT,
    LINK_BROKE,
    LINK_DROPPED,
    PEER_FAILED,
    MISMATCH,
    STEP_MISMATCH,
    REVOKED,
    ABORTED,
    FAILED,
    ERROR,
)
#: Kinds whose ``peer`` is the far end of the call's own link (a rank of the communicator).
PEER_KINDS = frozenset({TIMEOUT, LINK_BROKE, LINK_DROPPED, PEER_FAILED, MISMATCH, STEP_MISMATCH})
DIRECTIONS = ("send", "recv")
_MAX_TEXT = 200


@dataclasses.dataclass(frozen=True, slots=True)
class CallFault:
    """How one call failed: ``kind`` (see :data:`KINDS`), the ``peer`` its link names and
    the ``direction`` it moved bytes in, the job failure's ``origin`` (revoked or seen
    here), and for a mismatch the call this rank made (``mine``), the peer's (``theirs``,
    in the runtime's words: ``broadcast(float32, root 0, count 8)``) and its seq."""

    kind: str
    peer: int | None = None
    direction: str = ""
    origin: int | None = None
    mine: str = ""
    theirs: str = ""
    their_seq: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v not in (None, "")}


def fault_of(exc: BaseException) -> CallFault:
    """The facts an error carries about its call (an error without a ``fault`` field, or
    not cclctl's, is an ``error``)."""
    fields = exc.fields if isinstance(exc, CclError) else {}
    kind = fields.get("fault")
    if kind not in KINDS:
        return CallFault(ERROR)
    direction = fields.get("waiting_for")
    direction = direction if direction in DIRECTIONS else ""
    peer = _rank(fields.get("peer")) if kind in PEER_KINDS else None
    if kind == TIMEOUT and not direction:
        peer = None  # a timeout names its peer together with the direction, or neither
    mismatch = kind == MISMATCH
    return CallFault(
        kind,
        peer=peer,
        direction=direction if kind in (TIMEOUT, LINK_BROKE) else "",
        origin=_rank(fields.get("origin")) if kind in (REVOKED, FAILED) else None,
        mine=str(fields.get("mine", ""))[:_MAX_TEXT] if mismatch else "",
        theirs=str(fields.get("theirs", ""))[:_MAX_TEXT] if mismatch else "",
        their_seq=_rank(fields.get("peer_seq")) if mismatch else None,
    )


def _rank(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _fail(where: str, why: str) -> BadInput:
    return BadInput(f"{where}: {why}", where=where)


def fault_from_dict(data: object, where: str = "fault") -> CallFault:
    """Validate a record's ``fault`` (untrusted input); unknown keys are ignored."""
    if not isinstance(data, Mapping):
        raise _fail(where, f"expected an object, got {type(data).__name__}")
    kind = data.get("kind")
    if kind not in KINDS:
        raise _fail(where, f"unknown kind {str(kind)[:40]!r}")
    ints: dict[str, int | None] = {}
    for name in ("peer", "origin", "their_seq"):
        value = data.get(name)
        if value is not None and not (_rank(value) is not None and 0 <= value <= limits.MAX_INT):
            raise _fail(where, f"field {name!r} must be a non-negative integer or null")
        ints[name] = value
    texts: dict[str, str] = {}
    for name in ("direction", "mine", "theirs"):
        value = data.get(name, "")
        if not isinstance(value, str):
            raise _fail(where, f"field {name!r} must be a string")
        texts[name] = value[:_MAX_TEXT]
    if texts["direction"] not in ("", *DIRECTIONS):
        raise _fail(where, f"field 'direction' is {texts['direction'][:40]!r}, not send or recv")
    return CallFault(
        str(kind),
        peer=ints["peer"],
        direction=texts["direction"],
        origin=ints["origin"],
        mine=texts["mine"],
        theirs=texts["theirs"],
        their_seq=ints["their_seq"],
    )
