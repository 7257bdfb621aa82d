"""The revoke record: a failure as one event, with its origin, that every rank reports.

The first rank to see a failure (a peer's process gone, a broken link, a mismatched call,
a hang the watchdog expired, a local error, an operator's abort) writes one
:class:`Revocation`; it spreads to every member (shared memory, the links, the job's store)
and every rank's error, status and dump then name the same origin instead of a neighbour.
The record is small JSON, the same bytes in a shared-memory area, a link frame and the
store's ``revoke`` key, and is validated like any other input before it is trusted.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from typing import Any

from cclctl import limits
from cclctl.errors import BadInput

SCHEMA = "cclctl.revoke"
VERSION = 1

#: What a failure was, at its origin:
#: ``died``      the origin rank's process is gone;
#: ``link``      the link between ``origin`` and ``peer`` broke while both may live;
#: ``mismatch``  the origin called another collective (op, count, dtype, root) at ``seq``;
#: ``hang``      a watchdog expired a call; ``origin`` is the rank the hang waits on;
#: ``error``     the origin's own call failed (a local error);
#: ``aborted``   an operator (``origin`` is :data:`OPERATOR`) or an abort policy aborted it;
#: ``retry``     an operator (``cclctl retry``) asked every rank to re-run its interrupted
#:               all_reduce under the next epoch: no rank failed.
KINDS = ("died", "link", "mismatch", "hang", "error", "aborted", "retry")
#: Kinds that a rank sees only from one side: another rank may know better (a dead peer
#: behind a broken link, the odd one out of a mismatch), so they are agreed in the store.
WEAK_KINDS = frozenset({"link", "mismatch"})
#: ``origin`` and ``seen_by`` of an operator's abort.
OPERATOR = -1

#: The job-scoped store key that holds the job's one revoke record (first writer wins).
KEY = "revoke"
#: Bytes a record may take on the wire, in shared memory and in the store.
MAX_BYTES = 2048
_MAX_REASON = 400
#: The facts a record holds as text fields beside its words (see :class:`Revocation`).
_FACTS = ("called", "peer_called", "not_retried", "symptom")


def ack_key(rank: int) -> str:
    """The job-scoped store key where ``rank`` acknowledges the job's revoke record."""
    return f"revoke_ack/{rank}"


@dataclasses.dataclass(frozen=True, slots=True)
class Revocation:
    """One failure: its ``kind``, the ``origin`` rank (with ``host`` and ``pid`` where
    known), ``reason`` in words, the communicator, epoch and call it hit (``seq``, ``op``,
    ``call``: the call in words), who saw it first (``seen_by``, ``via``: ``pidfd``,
    ``link``, ``watchdog``, ``call``, ``operator``, ``launcher``), the other end of a link
    (``peer``), who aborted (``by``) and when (``time_ns``, wall clock).

    As fields beside the words: a ``mismatch`` names what the origin ``called`` and what
    ``peer`` called (``peer_called``), in the runtime's words; a ``hang`` the ``symptom``
    its origin was named by (a diagnosis verdict kind: ``stopped``, ``stale``, ``missing``,
    ``not_entered``, ``stuck``); an abort that stands for an operator's retry this rank
    could not do says why (``not_retried``). Older records have them empty."""

    kind: str
    origin: int
    reason: str
    host: str = ""
    pid: int = 0
    comm: str = ""
    epoch: int = 0
    seq: int | None = None
    op: str | None = None
    call: str = ""
    seen_by: int = OPERATOR
    via: str = "call"
    peer: int | None = None
    by: str = ""
    time_ns: int = dataclasses.field(default_factory=time.time_ns)
    called: str = ""
    peer_called: str = ""
    not_retried: str = ""
    symptom: str = ""

    def of_life(self, comm: str, epoch: int) -> bool:
        """A record for ``comm``'s present life (its ``epoch``): an operator's (any epoch),
        or one of this epoch or later (an older one is a failure a retry already got past)."""
        return self.comm in ("", comm) and (self.origin == OPERATOR or self.epoch >= epoch)

    # ------------------------------------------------------------------ words
    def who(self, rank: int | None = None, host: str | None = None, pid: int | None = None) -> str:
        """``rank 6 (pid 3630 on vm)``: the origin, or ``rank`` with what is known of it."""
        rank = self.origin if rank is None else rank
        host = self.host if host is None else host
        pid = self.pid if pid is None else pid
        where = [f"pid {pid}" if pid else "", f"on {host}" if host else ""]
        inside = " ".join(w for w in where if w)
        return f"rank {rank} ({inside})" if inside else f"rank {rank}"

    def seer(self) -> str:
        """Who saw it first, in words: ``rank 3``, ``rank 3's watchdog``, ``the launcher``."""
        if self.via == "operator" or self.seen_by == OPERATOR:
            return "the operator" if self.via != "launcher" else "the launcher"
        return (
            f"rank {self.seen_by}'s watchdog" if self.via == "watchdog" else f"rank {self.seen_by}"
        )

    def describe(self) -> str:
        """The failure in one phrase, origin first:
        ``rank 6 (pid 3630 on vm) died (SIGKILL, seen by rank 3)``."""
        seen = f"seen by {self.seer()}"
        if self.kind == "retry":
            asked = f"retry asked by operator {self.by or 'unknown'}"
            return f"{asked}: {self.reason}" if self.reason else asked
        if self.kind == "aborted":
            if self.origin == OPERATOR:
                return f"aborted by operator {self.by or 'unknown'}: {self.reason}"
            return f"aborted by {self.seer()}: {self.reason}"
        if self.kind == "died":
            return f"{self.who()} died ({self.reason}, {seen})"
        if self.kind == "link":
            ends = f"rank {self.origin} and rank {self.peer}"
            return f"link between {ends} broke ({self.reason}, {seen})"
        if self.kind in ("mismatch", "hang"):  # the reason is a predicate: "called ..."
            return f"{self.who()} {self.reason} ({seen})"
        return f"{self.who()} failed: {self.reason} ({seen})"

    def at(self) -> str:
        """``all_reduce seq 5`` (the call it hit), or empty outside any call."""
        return "" if self.op is None else f"{self.op} seq {self.seq}"

    def explains(self, rank: int) -> bool:
        """True if this failure is ``rank``'s own or its link's: a break seen at ``rank``
        is then this failure's follow-on, not a failure of its own."""
        return rank == self.origin or (self.kind == "link" and rank == self.peer)

    # ------------------------------------------------------------------ bytes
    def to_dict(self) -> dict[str, Any]:
        doc = {"schema": SCHEMA, "version": VERSION, **dataclasses.asdict(self)}
        doc["reason"] = self.reason[:_MAX_REASON]
        for name in ("call", *_FACTS):
            doc[name] = doc[name][:_MAX_REASON]
        return doc

    def encode(self) -> bytes:
        """The record as compact JSON, at most :data:`MAX_BYTES` (long texts are cut)."""
        data = json.dumps(self.to_dict(), separators=(",", ":")).encode()
        if len(data) > MAX_BYTES:  # only the free texts can be long
            texts = ("reason", "call", "by", *_FACTS)
            short = dataclasses.replace(self, **{k: getattr(self, k)[:100] for k in texts})
            data = json.dumps(short.to_dict(), separators=(",", ":")).encode()
        return data[:MAX_BYTES]

    def replace(self, **changes: Any) -> Revocation:
        return dataclasses.replace(self, **changes)


def _fail(where: str, why: str) -> BadInput:
    return BadInput(f"{where}: {why}")


def _int(
    data: Mapping[str, Any], key: str, where: str, *, optional: bool = False, rank: bool = False
) -> int | None:
    """The field as an integer: 0 up to a 64-bit word's largest; with ``rank``, a rank
    below :data:`cclctl.limits.MAX_WORLD_SIZE` or :data:`OPERATOR` (a record is untrusted:
    an origin of 10**12 must not be shown as a dead rank)."""
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise _fail(where, f"field {key!r} must be an integer")
    if rank and not (value == OPERATOR or 0 <= value < limits.MAX_WORLD_SIZE):
        top = limits.MAX_WORLD_SIZE - 1
        raise _fail(where, f"field {key!r} is {_short(value)}, not a rank (0 to {top:,}, or -1)")
    if not rank and not 0 <= value <= limits.MAX_INT:
        raise _fail(where, f"field {key!r} is {_short(value)}, outside 0 to 2**63-1")
    return value


def _short(value: int) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"


def _str(data: Mapping[str, Any], key: str, where: str) -> str:
    value = data.get(key, "")
    if not isinstance(value, str):
        raise _fail(where, f"field {key!r} must be a string")
    return value[:_MAX_REASON]


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def from_dict(data: object, where: str = "revoke record") -> Revocation:
    """Validate a parsed record; anything unusable is :class:`BadInput`."""
    if not isinstance(data, Mapping):
        raise _fail(where, "expected a JSON object")
    if data.get("schema") != SCHEMA:
        raise _fail(where, f"not a cclctl revoke record (schema is {data.get('schema')!r})")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version > VERSION:
        raise _fail(where, f"unsupported revoke record version {version!r}")
    kind = data.get("kind")
    if kind not in KINDS:
        raise _fail(where, f"unknown kind {kind!r}")
    op = data.get("op")
    if op is not None and not isinstance(op, str):
        raise _fail(where, "field 'op' must be a string")
    return Revocation(
        kind=str(kind),
        origin=_or(_int(data, "origin", where, rank=True), OPERATOR),
        reason=_str(data, "reason", where),
        host=_str(data, "host", where),
        pid=_int(data, "pid", where, optional=True) or 0,
        comm=_str(data, "comm", where),
        epoch=_int(data, "epoch", where, optional=True) or 0,
        seq=_int(data, "seq", where, optional=True),
        op=None if op is None else op[:64],
        call=_str(data, "call", where),
        seen_by=_or(_int(data, "seen_by", where, optional=True, rank=True), OPERATOR),
        via=_str(data, "via", where) or "call",
        peer=_int(data, "peer", where, optional=True, rank=True),
        by=_str(data, "by", where),
        time_ns=_int(data, "time_ns", where, optional=True) or 0,
        called=_str(data, "called", where),
        peer_called=_str(data, "peer_called", where),
        not_retried=_str(data, "not_retried", where),
        symptom=_str(data, "symptom", where)[:32],
    )


def decode(raw: bytes, where: str = "revoke record") -> Revocation:
    """Parse a record's bytes (from a peer, a link or the store) defensively."""
    if len(raw) > MAX_BYTES:
        raise _fail(where, f"{len(raw)} bytes is over the {MAX_BYTES}-byte limit")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _fail(where, f"not valid JSON ({exc})") from None
    return from_dict(data, where)
