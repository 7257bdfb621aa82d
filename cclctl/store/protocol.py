"""Wire format of the rendezvous store: struct-packed frames of raw byte fields, no pickle.

A request is ``op:u8 timeout:f64 nfields:u32``, then ``nfields`` field lengths (``u32``
each), then the fields back to back. A reply is the same with ``status:u8`` in place of op
and timeout. Fixed-size headers let both sides read a frame in three exact reads, so a
round trip costs a few syscalls and no parsing beyond ``struct``.
"""

from __future__ import annotations

import enum
import functools
import struct
from collections.abc import Sequence

REQUEST_HEADER = struct.Struct("!BdI")  # op, timeout in seconds (< 0: none), field count
REPLY_HEADER = struct.Struct("!BI")  # status, field count

#: A frame larger than this is garbage (or an attack), not a store request.
MAX_FRAME_BYTES = 1 << 30
MAX_FIELDS = 1 << 20

NO_TIMEOUT = -1.0


class Op(enum.IntEnum):
    """Request kinds; fields are listed as (field, ...) -> reply fields."""

    SET = 1  # (key, value) -> ()
    GET = 2  # (key,) -> (value,); blocks up to the timeout
    TRY_GET = 3  # (key,) -> (value,) or NOT_FOUND
    ADD = 4  # (key, delta as decimal) -> (new value as decimal,)
    COMPARE_SET = 5  # (key, desired[, expected]) -> (value now stored,); no expected = absent
    WAIT = 6  # (key, ...) -> (); blocks up to the timeout
    LIST = 7  # (prefix,) -> (key, value, key, value, ...)
    DELETE = 8  # (key,) -> () or NOT_FOUND
    PING = 9  # () -> ()


class Status(enum.IntEnum):
    OK = 0
    NOT_FOUND = 1
    TIMEOUT = 2
    ERROR = 3  # one field: a message for the user


_EMPTY_REPLIES = {status: REPLY_HEADER.pack(status, 0) for status in Status}


@functools.lru_cache(maxsize=256)
def lengths_struct(count: int) -> struct.Struct:
    """The (cached) struct of ``count`` field lengths: formats are parsed once, not per frame."""
    return struct.Struct(f"!{count}I")


def _pack(header: bytes, fields: Sequence[bytes]) -> bytes:
    lengths = lengths_struct(len(fields)).pack(*map(len, fields))
    return b"".join((header, lengths, *fields))


def pack_request(op: Op, fields: Sequence[bytes], timeout_s: float | None = None) -> bytes:
    timeout = NO_TIMEOUT if timeout_s is None else float(timeout_s)
    return _pack(REQUEST_HEADER.pack(op, timeout, len(fields)), fields)


def pack_reply(status: Status, fields: Sequence[bytes] = ()) -> bytes:
    if not fields:
        return _EMPTY_REPLIES[status]
    return _pack(REPLY_HEADER.pack(status, len(fields)), fields)


def field_lengths(raw: bytes, count: int) -> tuple[int, ...]:
    """Decode the ``count`` lengths that follow a header; reject absurd totals."""
    lengths: tuple[int, ...] = lengths_struct(count).unpack(raw)
    if sum(lengths) > MAX_FRAME_BYTES:
        raise ValueError(f"a frame of {sum(lengths)} bytes is larger than the store accepts")
    return lengths


def split_fields(payload: bytes, lengths: Sequence[int]) -> list[bytes]:
    fields = []
    offset = 0
    for length in lengths:
        fields.append(payload[offset : offset + length])
        offset += length
    return fields


def take_request(buffer: bytearray) -> tuple[int, float, list[bytes]] | None:
    """Remove one complete request from the front of ``buffer``; None until it is all there.

    Raises ValueError for a frame no client of ours would send, so the server can hang up.
    """
    if len(buffer) < REQUEST_HEADER.size:
        return None
    op, timeout, count = REQUEST_HEADER.unpack_from(buffer)
    if count > MAX_FIELDS:
        raise ValueError(f"a request with {count} fields is not a store request")
    start = REQUEST_HEADER.size + 4 * count
    if len(buffer) < start:
        return None
    lengths = lengths_struct(count).unpack_from(buffer, REQUEST_HEADER.size)
    end = start + sum(lengths)
    if end - start > MAX_FRAME_BYTES:
        raise ValueError(f"a frame of {end - start} bytes is larger than the store accepts")
    if len(buffer) < end:
        return None
    frame = bytes(buffer[:end])
    del buffer[:end]
    return op, timeout, split_fields(frame[start:], lengths)
