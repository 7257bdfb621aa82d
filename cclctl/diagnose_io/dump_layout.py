"""Read a large dump in cclctl's layout piece by piece: its head, the tail of its records
ring and each communicator's last started call, never the whole file.

A dump is untrusted input up to :data:`cclctl.limits.MAX_FILE_BYTES`, and a diagnosis keeps
only the last :data:`TAIL` records of its ring, so reading it whole would cost memory in
proportion to the file (a 240 MB ring held 1.2 GB as bytes, a copy and parsed objects), not
to what is kept. Here the file is read in :data:`CHUNK`-sized pieces: forward to the records
array, backward from the end to the array's end and the records before it, and backward
through the ring for a communicator's last started call that is older than the tail. What is
parsed is bounded (:data:`HEAD_BYTES`, :data:`TAIL_BYTES`, :data:`RECORD_BYTES`); a file
that needs more is refused with a line that says which bound.

Record boundaries are found by the bytes ``{"comm":``: JSON escapes quotes inside strings,
so that sequence cannot occur inside a value, only where cclctl's writer starts a record.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, BinaryIO

from cclctl.errors import BadInput

#: Records kept from the end of the ring (the engine keeps 8 per communicator of them).
TAIL = 64
#: How much of the file one read takes.
CHUNK = 1 << 20
#: Files up to this size are read whole (then any JSON layout is read); larger ones here.
WHOLE_BYTES = 8 << 20
#: Bytes before the records array (identity, communicators, the call in flight).
HEAD_BYTES = 16 << 20
#: Bytes of the kept tail: the last records and what follows the array (counters, stacks).
TAIL_BYTES = 64 << 20
#: Bytes of one record found alone (a communicator's last started call).
RECORD_BYTES = 1 << 20
#: Above this many missing calls, the ring is scanned once with a pattern, not once a call.
MANY_KEYS = 16

RECORDS = b',"records":['
AFTER = b'],"counters":'
START = b'{"comm":'
_KEY = re.compile(rb'\{"comm":("(?:[^"\\]|\\.)*"),"seq":([0-9]{1,19}),')
TRUNCATED = "truncated JSON (the file ends in the middle of the document)"


def fail(path: str, why: str) -> BadInput:
    return BadInput(f"{path}: {why}", path=path)


def last_started(head: dict[str, Any]) -> dict[str, int]:
    """Each communicator's last started seq, as the document's ``comms`` state it."""
    comms = head.get("comms")
    if not isinstance(comms, dict):
        return {}
    wanted: dict[str, int] = {}
    for name, info in comms.items():
        seq = info.get("last_started") if isinstance(info, dict) else None
        if isinstance(seq, int) and not isinstance(seq, bool) and 0 < seq < 1 << 63:
            wanted[name] = seq
    return wanted


def key_of(comm: str, seq: int) -> bytes:
    """The bytes a collective record (comm, seq) starts with in cclctl's layout."""
    return START + json.dumps(comm).encode() + b',"seq":' + str(seq).encode() + b","


def _parse(data: bytes) -> Any:
    return json.loads(data)  # ValueError (UnicodeDecodeError too) or RecursionError


class LargeDump:
    """One open dump file read in pieces (see module doc); ``read()`` gives the head (a dict,
    with no records) and the kept records as (offset, parsed record) pairs."""

    def __init__(self, fh: BinaryIO, size: int, path: str) -> None:
        self.fh, self.size, self.path = fh, size, path
        self.lo = 0  # where the records array's contents start, once read

    def pread(self, offset: int, length: int) -> bytes:
        try:
            return os.pread(self.fh.fileno(), length, offset)
        except OSError as exc:
            raise fail(self.path, f"cannot read ({exc.strerror or exc})") from None

    def read(self) -> tuple[dict[str, Any], list[tuple[int, Any]]]:
        if not self.pread(max(0, self.size - 64), 64).rstrip().endswith(b"}"):
            raise fail(self.path, TRUNCATED)
        self.lo = lo = self._forward(RECORDS, HEAD_BYTES) + len(RECORDS)
        hi = self._array_end(lo)
        try:
            head = _parse(self.pread(0, lo) + self.pread(hi, self.size - hi))
        except RecursionError:
            raise fail(self.path, "JSON nested too deeply") from None
        except ValueError as exc:
            raise fail(self.path, f"not valid JSON ({_why(exc)})") from None
        if not isinstance(head, dict):
            raise fail(self.path, f"expected a JSON object, got {type(head).__name__}")
        cut, tail = self._tail(lo, hi)
        have = {(r.get("comm"), r.get("seq")) for _, r in tail if _collective(r)}
        missing = {k: v for k, v in last_started(head).items() if (k, v) not in have}
        return head, self._earlier(lo, cut, missing) + tail

    def _forward(self, marker: bytes, limit: int) -> int:
        """The offset of the first ``marker`` within the first ``limit`` bytes."""
        pos, buf, base = 0, b"", 0  # buf holds the bytes [base, pos)
        while pos < min(self.size, limit):
            piece = self.pread(pos, CHUNK)
            if not piece:
                break
            keep = buf[len(buf) - len(marker) + 1 :] if buf else b""
            base, buf, pos = pos - len(keep), keep + piece, pos + len(piece)
            at = buf.find(marker)
            if at >= 0:
                return base + at
        raise fail(
            self.path,
            f"no records array in its first {limit >> 20} MB: not a dump in cclctl's layout "
            f"(a file over {WHOLE_BYTES >> 20} MB is read only in that layout)",
        )

    def _array_end(self, lo: int) -> int:
        """The offset of the records array's end (the last ``],"counters":``)."""
        pos, buf = self.size, b""
        while pos > lo and self.size - pos < TAIL_BYTES:
            step = min(CHUNK, pos - lo)
            pos -= step
            buf = self.pread(pos, step) + buf[: len(AFTER) - 1]
            at = buf.rfind(AFTER)
            if at >= 0:
                return pos + at
        raise fail(self.path, f"no end of its records array in its last {TAIL_BYTES >> 20} MB")

    def _tail(self, lo: int, hi: int) -> tuple[int, list[tuple[int, Any]]]:
        """The last :data:`TAIL` records of the array [lo, hi) and where the first starts."""
        pos, buf, cut, starts = hi, b"", 0, 0  # buf holds [pos, hi); starts found in buf[cut:]
        while True:
            while starts < TAIL and (found := buf.rfind(START, 0, cut)) >= 0:
                cut, starts = found, starts + 1
            if starts >= TAIL or pos == lo:
                break
            if hi - pos >= TAIL_BYTES:
                raise fail(self.path, f"its last {TAIL} records take over {TAIL_BYTES >> 20} MB")
            step = min(CHUNK, pos - lo)
            pos -= step
            buf = self.pread(pos, step) + buf
            cut += step
        if starts < TAIL and buf[:cut].strip():
            raise fail(self.path, "records not laid out as cclctl writes them")
        try:
            records = _parse(b"[" + buf[cut:] + b"]")
        except (ValueError, RecursionError):
            raise fail(self.path, "a record near the end of the ring is not valid JSON") from None
        offsets = _starts(buf, cut)
        return pos + cut, [(pos + at, rec) for at, rec in zip(offsets, records, strict=False)]

    def _earlier(self, lo: int, hi: int, missing: dict[str, int]) -> list[tuple[int, Any]]:
        """Each missing (comm, last started seq)'s collective record in [lo, hi), newest
        occurrence first; a call the ring no longer holds is left out."""
        want = {(comm, seq): key_of(comm, seq) for comm, seq in missing.items()}
        overlap = max(map(len, want.values()), default=0)  # a key may straddle two reads
        found: dict[tuple[str, int], tuple[int, Any]] = {}
        end = hi
        while end > lo and len(found) < len(want):
            start = max(lo, end - CHUNK)
            chunk = self.pread(start, min(hi, end + overlap) - start)
            spots = _spots(chunk, end - start, {k: v for k, v in want.items() if k not in found})
            for key, at in spots:
                rec = self._record_at(start + at, hi)
                if rec is not None and key not in found:
                    found[key] = (start + at, rec)
            end = start
        return [found[k] for k in sorted(found)]

    def _record_at(self, offset: int, hi: int) -> Any:
        """The collective record starting at ``offset``, parsed alone (None: point-to-point,
        or not JSON)."""
        data = self.pread(offset, min(RECORD_BYTES, hi - offset))
        end = data.find(b"," + START, 1)
        try:
            rec = _parse(data if end < 0 else data[:end])
        except (ValueError, RecursionError):
            return None
        return rec if _collective(rec) else None

    def index_of(self, offset: int, lo: int) -> int:
        """How many records start in [lo, offset): a record's index in the ring."""
        count, pos = 0, lo
        while pos < offset:
            stop = min(pos + CHUNK, offset)
            count += self.pread(pos, stop - pos + len(START) - 1).count(START)
            pos = stop
        return count


def _collective(rec: Any) -> bool:
    return isinstance(rec, dict) and rec.get("peer") is None


def _starts(buf: bytes, cut: int) -> list[int]:
    out, at = [], buf.find(START, cut)
    while at >= 0:
        out.append(at)
        at = buf.find(START, at + 1)
    return out


def _spots(
    chunk: bytes, end: int, want: dict[tuple[str, int], bytes]
) -> list[tuple[tuple[str, int], int]]:
    """(call, offset) of every wanted key starting before ``end`` in ``chunk``, last first."""
    spots: list[tuple[tuple[str, int], int]] = []
    if len(want) > MANY_KEYS:
        by_bytes = {v: k for k, v in want.items()}
        for m in _KEY.finditer(chunk):
            hit = by_bytes.get(m.group(0))
            if hit is not None and m.start() < end:
                spots.append((hit, m.start()))
    else:
        for call, key in want.items():
            at = chunk.rfind(key, 0, end + len(key) - 1)
            while at >= 0:
                spots.append((call, at))
                at = chunk.rfind(key, 0, at)
    spots.sort(key=lambda s: -s[1])
    return spots


def _why(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    return str(exc).split(";")[0]  # an integer of thousands of digits, bad UTF-8
