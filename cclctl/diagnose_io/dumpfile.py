"""Read one flight-recorder dump file, defensively and fast, keeping only its tail.

A dump holds up to thousands of records per communicator, and a diagnosis needs the last few
of each. A dump in the layout cclctl writes is read in pieces (:mod:`.dump_layout`): its
head, the tail of its records ring and each communicator's last started call, so time and
memory follow what is kept, not the file's size (up to :data:`cclctl.limits.MAX_FILE_BYTES`).
A small file that is not in that layout (pretty-printed, keys reordered) is parsed whole,
which also words the error of a broken one; a large one is refused with the reason.
"""

from __future__ import annotations

import json
from typing import Any

from cclctl import limits
from cclctl.diagnose_io.dump_layout import TAIL, TRUNCATED, WHOLE_BYTES, LargeDump, last_started
from cclctl.diagnose_io.dump_layout import fail as fail
from cclctl.errors import BadInput
from cclctl.records import RankSnapshot, record_from_dict, snapshot_from_dict

#: A dump of 2,000 records per communicator is about 0.6 MB; this is far beyond any.
MAX_BYTES = limits.MAX_FILE_BYTES
__all__ = ["MAX_BYTES", "TAIL", "fail", "read_dump"]


def read_dump(path: str) -> RankSnapshot:
    """Parse one dump (or status) file; the records are cut to their tail (see module doc)."""
    try:
        with open(path, "rb") as fh:
            size = limits.file_size(fh.fileno(), path)  # too large or sparse: refused unread
            _check_start(fh.read(65536), size, path)
            try:
                return _in_layout(LargeDump(fh, size, path))
            except BadInput:
                if size > WHOLE_BYTES:
                    raise
            fh.seek(0)
            data = fh.read()  # read(n) would reserve n bytes up front
    except IsADirectoryError:
        raise fail(path, "is a directory") from None
    except OSError as exc:
        raise fail(path, f"cannot read ({exc.strerror or exc})") from None
    return _slow(data, path)


def _check_start(first: bytes, size: int, path: str) -> None:
    if size <= len(first) and not first.strip():
        raise fail(path, "empty file")
    if b"\x00" in first:
        raise fail(path, "binary data, not a JSON dump")


def _in_layout(dump: LargeDump) -> RankSnapshot:
    """The snapshot from a dump in cclctl's layout, its records validated where they are
    (a bad record is named by its index in the whole ring)."""
    head, kept = dump.read()
    head["records"] = []
    snap = snapshot_from_dict(head, dump.path)
    records = []
    for offset, raw in kept:
        try:
            records.append(record_from_dict(raw, "record"))
        except BadInput as exc:
            where = f"{dump.path}: record {dump.index_of(offset, dump.lo)}"
            raise BadInput(f"{where}{exc.message[len('record') :]}", where=where) from None
    snap.records = records
    return snap


def _slow(data: bytes, path: str) -> RankSnapshot:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:  # a character cut at the end is a cut document
        cut = exc.reason == "unexpected end of data" and exc.end == len(data)
        raise fail(path, TRUNCATED if cut else "binary data, not a JSON dump") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        if _ends_inside(exc, text):
            raise fail(path, TRUNCATED) from None
        raise fail(
            path, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise fail(path, "JSON nested too deeply") from None
    except ValueError as exc:  # an integer of thousands of digits
        raise fail(path, f"not valid JSON ({str(exc).split(';')[0]})") from None
    snap = snapshot_from_dict(doc, path)
    snap.records = _cut(snap.records, doc)
    return snap


def _ends_inside(exc: json.JSONDecodeError, text: str) -> bool:
    """The decoder stopped because the text ends: past its last byte, in an unterminated
    string, or in a ``\\uXXXX`` escape the end cut short."""
    if exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string"):
        return True
    return exc.msg.startswith("Invalid \\uXXXX escape") and exc.pos + 6 > len(text)


def _cut(records: list[Any], doc: Any) -> list[Any]:
    """The records the fast path would have kept, for dumps read the slow way."""
    if len(records) <= TAIL:
        return records
    tail = records[-TAIL:]
    have = {(r.comm, r.seq) for r in tail if r.peer is None}
    wanted = last_started(doc) if isinstance(doc, dict) else {}
    lost = {(c, s) for c, s in wanted.items() if (c, s) not in have}
    earlier = [r for r in records[:-TAIL] if r.peer is None and (r.comm, r.seq) in lost]
    return earlier + tail
