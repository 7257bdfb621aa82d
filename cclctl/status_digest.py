"""A plain status as a few numbers: what a host agent's summary says of each of its ranks, so
a reader of a large job parses one status per kind of rank instead of every rank's.

In a job of 100,000 ranks nearly every status says the same thing: the same
communicators, the same seqs, the same call in flight. What differs from rank to rank is
the rank's own identity (its pid and the time it wrote), and, of its call in flight, when
it started, the step it reached and whom it waits on. A host agent reduces each status
it decoded to a *digest*: those numbers, and a *key*: a hash of everything else, after
the fields that differ by rank (and the slow signals and counters, which no hang
diagnosis reads) are left out. Ranks of one key are alike: a reader parses one of them
(the *model*) in full and makes the others from it and their digests (:class:`Alike`).

Only a *plain* status gets a digest: a live status with no revoke record, no stacks, no
ending, no error or retry counted, whose records have no fault or error and are all
collectives (a point-to-point call waits on a peer of its own). Any other status has
none, and readers parse it as it is: a rank that could be the answer is always read in
full.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import operator
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeGuard

from cclctl import limits
from cclctl.records import COMPLETED, STARTED, CollectiveRecord, RankSnapshot

#: A status's fields that differ by rank, or that no hang diagnosis reads.
_OWN = ("rank", "pid", "host", "time_ns", "metrics_url", "signals", "counters")
#: A record's fields that differ by rank.
_RECORD_OWN = ("start_ns", "end_ns", "step", "waiting_on", "waiting_for", "stages")
#: Counters that make a status worth reading in full when they are not zero.
_TROUBLE = ("errors", "retries", "hangs")
#: How long a key is (hex digits of a BLAKE2b digest).
KEY_CHARS = 24
#: How long a text's hash is (hex digits).
TEXT_CHARS = 16
#: What a digest holds, in order: [pid, time_ns, key, in-flight call or None, the hash of
#: the status's text], the in-flight call as [start_ns, step, waiting_on, waiting_for].
#: The text's hash ties the digest to the one text it was made from: a reader whose
#: text does not hash to it parses that status in full.
FIELDS = ("pid", "time_ns", "key", "inflight", "text")
_WAITING_FOR = (None, "send", "recv")


def text_hash(text: str) -> str:
    """The hash of a status's text a digest carries."""
    return hashlib.blake2b(text.encode(), digest_size=TEXT_CHARS // 2).hexdigest()


def digest(doc: object, text: str = "") -> list[Any] | None:
    """The digest of a status decoded from ``text`` (see :data:`FIELDS`), or None where it
    is not plain."""
    if not isinstance(doc, dict) or doc.get("schema") != "cclctl.status":
        return None
    if doc.get("revoke") or doc.get("stacks") or doc.get("finished") or doc.get("ending"):
        return None
    if doc.get("reason"):
        return None
    counters = doc.get("counters") or {}
    if not isinstance(counters, dict) or any(counters.get(name) for name in _TROUBLE):
        return None
    records, inflight = doc.get("records", []), doc.get("inflight")
    if not isinstance(records, list) or not all(_plain(r) for r in records):
        return None
    if inflight is not None and not (_plain(inflight) and inflight.get("state") == STARTED):
        return None
    pid, time_ns = doc.get("pid"), doc.get("time_ns")
    if not is_count(pid) or not is_count(time_ns) or max(pid, time_ns) > limits.MAX_INT:
        return None
    rest = {k: v for k, v in doc.items() if k not in _OWN}
    rest["records"] = [_common(r) for r in records]
    rest["inflight"] = None if inflight is None else _common(inflight)
    common = json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()
    key = hashlib.blake2b(common, digest_size=KEY_CHARS // 2).hexdigest()
    call = None
    if inflight is not None:
        call = [inflight.get(k) for k in ("start_ns", "step", "waiting_on", "waiting_for")]
    return [pid, time_ns, key, call, text_hash(text)]


def _plain(rec: object) -> bool:
    return (
        isinstance(rec, dict)
        and rec.get("state", STARTED) in (STARTED, COMPLETED)
        and rec.get("peer") is None
        and not rec.get("error")
        and not rec.get("fault")
    )


def _common(rec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k not in _RECORD_OWN}


def is_count(value: object) -> TypeGuard[int]:
    """A count, seq, pid or clock: a non-negative int (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Digest(NamedTuple):
    """One rank's digest, checked (:func:`checked`); a tuple, since a reader of a large job
    makes one per rank."""

    pid: int
    time_ns: int
    key: str
    #: the call in flight: (start_ns, step, waiting_on, waiting_for), or None
    call: tuple[int, int, int | None, str | None] | None
    text: str  # the hash of the status's text


def checked(row: object) -> Digest | None:
    """A digest as a host document carries it, or None where it does not have the shape
    (the reader then parses that rank's status in full). Numbers must be plain JSON ints:
    anything else goes the long way, through the rank's whole status."""
    if type(row) is not list or len(row) != len(FIELDS):
        return None
    pid, time_ns, key, call, text = row
    if not (type(pid) is int and type(time_ns) is int and pid >= 0 and time_ns >= 0):
        return None
    if not (type(key) is str and type(text) is str):
        return None
    if len(key) != KEY_CHARS or len(text) != TEXT_CHARS:
        return None
    if call is None:
        return Digest(pid, time_ns, key, None, text)
    if type(call) is not list or len(call) != 4:
        return None
    start, step, on, waiting_for = call
    start = 0 if start is None else start
    step = 0 if step is None else step
    if not (type(start) is int and type(step) is int and start >= 0 and step >= 0):
        return None
    if on is not None and not (type(on) is int and on >= 0):
        return None
    if waiting_for not in _WAITING_FOR:
        return None
    return Digest(pid, time_ns, key, (start, step, on, waiting_for), text)


class Alike:
    """Makes the statuses of a key's ranks from its model (a rank of the key, parsed in
    full) and each rank's digest: its identity and clock, and its call in flight. A made
    rank's completed calls' records are the model's (their timings are the model's); it
    carries no slow signals and the model's counters."""

    def __init__(self, model: RankSnapshot) -> None:
        self.model = model
        self._fields = _SNAPSHOT_FIELDS(model)
        call = model.inflight
        self._call = None if call is None else _RECORD_FIELDS(call)
        #: where the model's records hold its call in flight (a made rank's goes there)
        at = [] if call is None else [i for i, r in enumerate(model.records) if _same(r, call)]
        self._at = at

    def make(self, rank: int, host: str, own: Digest) -> RankSnapshot:
        """Rank ``rank``'s status on ``host``, from the model and ``own`` digest."""
        snap = RankSnapshot(*self._fields)
        snap.rank, snap.host, snap.pid, snap.time_ns = rank, host, own.pid, own.time_ns
        snap.signals = None
        if self._call is None or own.call is None:
            return snap
        call = CollectiveRecord(*self._call)
        call.start_ns, call.step, call.waiting_on, call.waiting_for = own.call
        snap.inflight = call
        records = snap.records = list(self.model.records)
        for i in self._at:
            records[i] = call
        return snap


def _fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


_SNAPSHOT_FIELDS = operator.attrgetter(*_fields(RankSnapshot))
_RECORD_FIELDS = operator.attrgetter(*_fields(CollectiveRecord))


def _same(a: CollectiveRecord, b: CollectiveRecord) -> bool:
    """The same attempt at the same call."""
    return (a.comm, a.seq, a.epoch, a.attempt, a.state) == (
        b.comm,
        b.seq,
        b.epoch,
        b.attempt,
        b.state,
    )
