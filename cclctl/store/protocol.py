"""Wire format of the rendezvous store: struct-packed frames of raw byte fields, no pickle.

A request is ``op:u8 timeout:f64 nfields:u32``, then ``nfields`` field lengths (``u32``
each), then the fields back to back. A reply is the same with ``status:u8`` in place of op
and timeout. Fixed-size headers let both sides read a frame in three exact reads, so a
round trip costs a few syscalls and no parsing beyond ``struct``. The server reads requests
with :class:`cclctl.store.frames.FrameReader`, which checks each frame's size at its header.
"""

from __future__ import annotations

import enum
import functools
import struct
from collections.abc import Sequence

from cclctl.config import DEFAULT_STORE_MAX_FRAME

REQUEST_HEADER = struct.Struct("!BdI")  # op, timeout in seconds (< 0: none), field count
REPLY_HEADER = struct.Struct("!BI")  # status, field count

#: The default cap on a request frame (``CCLCTL_STORE_MAX_FRAME``): far above the largest
#: value a job stores (status documents, addresses: kilobytes), far below a memory attack.
DEFAULT_MAX_FRAME_BYTES = DEFAULT_STORE_MAX_FRAME
#: A reply larger than this is garbage, not a store's answer.
MAX_REPLY_BYTES = 1 << 30
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
    HELLO = 10  # (client nonce,) -> (server nonce, server proof); see cclctl.store.access
    AUTH = 11  # (client proof,) -> (); a wrong proof closes the connection
    SET_MANY = 12  # (key, value, key, value, ...) -> (); every key set at once


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
    """Decode the ``count`` lengths that follow a reply's header; reject absurd totals."""
    lengths: tuple[int, ...] = lengths_struct(count).unpack(raw)
    if sum(lengths) > MAX_REPLY_BYTES:
        raise ValueError(f"a reply of {sum(lengths)} bytes is larger than a store sends")
    return lengths


def split_fields(payload: bytes, lengths: Sequence[int]) -> list[bytes]:
    fields = []
    offset = 0
    for length in lengths:
        fields.append(payload[offset : offset + length])
        offset += length
    return fields
