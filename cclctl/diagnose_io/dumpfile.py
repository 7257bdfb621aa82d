"""Read one flight-recorder dump file, defensively and fast, keeping only its tail.

A dump holds up to thousands of records per communicator, and a diagnosis needs the last few
of each. Parsing all of them adds up to seconds over hundreds of ranks, so the fast path
parses the document *without* its records array (which still checks every other byte, the
end of the file included, so a truncated dump is caught), then only the tail of the array,
plus each communicator's last started call found by its exact bytes. Anything the
fast path does not recognise falls back to the plain full parse, which also words the error.

Record boundaries are found by the bytes ``{"comm":``: JSON escapes quotes inside strings,
so that sequence cannot occur inside a value, only where cclctl's writer starts a record.
"""

from __future__ import annotations

import json
from typing import Any

from cclctl import limits
from cclctl.errors import BadInput
from cclctl.records import DUMP_SCHEMA, STATUS_SCHEMA, RankSnapshot, snapshot_from_dict

#: A dump of 2,000 records per communicator is about 0.6 MB; this is far beyond any.
MAX_BYTES = limits.MAX_FILE_BYTES
#: Records kept from the end of the ring (the engine keeps 8 per communicator of them).
TAIL = 64

_RECORDS = b',"records":['
_AFTER = b'],"counters":'
_START = b'{"comm":'


def fail(path: str, why: str) -> BadInput:
    return BadInput(f"{path}: {why}", path=path)


def read_bytes(path: str) -> bytes:
    """The file's bytes, or BadInput saying plainly why it cannot be a dump."""
    try:
        with open(path, "rb") as fh:
            limits.file_size(fh.fileno(), path)  # too large or sparse: refused unread
            data = fh.read()  # read(n) would reserve n bytes up front
    except IsADirectoryError:
        raise fail(path, "is a directory") from None
    except OSError as exc:
        raise fail(path, f"cannot read ({exc.strerror or exc})") from None
    if not data.strip():
        raise fail(path, "empty file")
    if b"\x00" in data[:65536]:
        raise fail(path, "binary data, not a JSON dump")
    return data


def read_dump(path: str) -> RankSnapshot:
    """Parse one dump (or status) file; the records are cut to their tail (see module doc)."""
    data = read_bytes(path)
    snap = _fast(data, path)
    return snap if snap is not None else _slow(data, path)


def _slow(data: bytes, path: str) -> RankSnapshot:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise fail(path, "binary data, not a JSON dump") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string"):
            raise fail(
                path, "truncated JSON (the file ends in the middle of the document)"
            ) from None
        raise fail(
            path, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise fail(path, "JSON nested too deeply") from None
    snap = snapshot_from_dict(doc, path)
    snap.records = _cut(snap.records, doc)
    return snap


def _fast(data: bytes, path: str) -> RankSnapshot | None:
    """The snapshot with only the records' tail parsed, or None to take the slow path."""
    start = data.find(_RECORDS)
    end = data.rfind(_AFTER)
    if start < 0 or end < start + len(_RECORDS) - 1:
        return None
    try:
        head = json.loads(data[: start + len(_RECORDS)] + data[end:])
    except (ValueError, RecursionError):
        return None  # UnicodeDecodeError is a ValueError
    if not isinstance(head, dict) or head.get("schema") not in (DUMP_SCHEMA, STATUS_SCHEMA):
        return None
    records = _tail(data[start + len(_RECORDS) : end], head)
    if records is None:
        return None
    head["records"] = records
    try:
        return snapshot_from_dict(head, path)
    except BadInput:
        return None  # let the full parse word it, with the record's real index


def _last_started(head: dict[str, Any]) -> dict[str, int]:
    comms = head.get("comms")
    if not isinstance(comms, dict):
        return {}
    wanted: dict[str, int] = {}
    for name, info in comms.items():
        seq = info.get("last_started") if isinstance(info, dict) else None
        if isinstance(seq, int) and seq > 0:
            wanted[name] = seq
    return wanted


def _tail(body: bytes, head: dict[str, Any]) -> list[Any] | None:
    """The last :data:`TAIL` records, plus each communicator's last started call wherever it
    is (a sub-group used once, long ago, must not force parsing the whole ring).
    """
    if not body.strip():
        return []
    cut, starts = len(body), 0
    while starts < TAIL and (found := body.rfind(_START, 0, cut)) >= 0:
        cut, starts = found, starts + 1
    if not starts or (starts < TAIL and body[:cut].strip()):
        return None  # not cclctl's record layout
    try:
        tail = json.loads(b"[" + body[cut:] + b"]")
    except (ValueError, RecursionError):
        return None
    have = {
        (r.get("comm"), r.get("seq")) for r in tail if isinstance(r, dict) and r.get("peer") is None
    }
    earlier: list[Any] = []
    for comm, seq in sorted(_last_started(head).items()):
        if (comm, seq) not in have:
            rec = _find(body, cut, comm, seq)
            if rec is not None:
                earlier.append(rec)
    return earlier + tail


def _find(body: bytes, before: int, comm: str, seq: int) -> Any:
    """The collective record (comm, seq) starting before ``before``, parsed alone; None when
    the ring does not hold it (it is off, or a foreign writer laid records out differently).
    """
    key = _START + json.dumps(comm).encode() + b',"seq":' + str(seq).encode() + b","
    at = body.rfind(key, 0, before)
    while at >= 0:
        end = body.find(b"," + _START, at + 1, before + 1)
        try:
            rec = json.loads(body[at : end if end >= 0 else before])
        except (ValueError, RecursionError):
            return None
        if isinstance(rec, dict) and rec.get("peer") is None:
            return rec
        at = body.rfind(key, 0, at)  # a point-to-point call with the same number
    return None


def _cut(records: list[Any], doc: Any) -> list[Any]:
    """The records the fast path would have kept, for dumps read the slow way."""
    if len(records) <= TAIL:
        return records
    tail = records[-TAIL:]
    have = {(r.comm, r.seq) for r in tail if r.peer is None}
    wanted = _last_started(doc) if isinstance(doc, dict) else {}
    lost = {(c, s) for c, s in wanted.items() if (c, s) not in have}
    earlier = [r for r in records[:-TAIL] if r.peer is None and (r.comm, r.seq) in lost]
    return earlier + tail
