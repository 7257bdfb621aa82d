"""The message header every transport puts in front of every payload.

It names the collective the sender is in: (comm, epoch, seq, step) so that anything from an
aborted attempt or a different call is refused, and (op, dtype, redop, root, count, nbytes) so
that a mismatched collective is reported as exactly what each side called, instead of as
corrupted data or a hang.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib

from cclctl.bandwidth import COLLECTIVES, VARYING
from cclctl.errors import ProtocolError

MAGIC = b"CL"
VERSION = 1
REDOPS = ("", "sum", "prod", "min", "max", "avg")
_HEADER = struct.Struct("<2sBBBBhIIQIQQ")  # 44 bytes, little endian, no padding
HEADER_SIZE = _HEADER.size

# Dtype codes are fixed (they travel on the wire); names are numpy's.
DTYPE_NAMES = (
    "",
    "float16",
    "float32",
    "float64",
    "int8",
    "int32",
    "int64",
    "uint8",
    "bfloat16",
    "int16",
    "uint16",
    "uint32",
    "uint64",
)
_DTYPE_CODES = {name: code for code, name in enumerate(DTYPE_NAMES)}
_OP_CODES = {name: code for code, name in enumerate(COLLECTIVES)}
# A send and the recv that takes it are one message: both sides' headers say "send".
_OP_CODES["recv"] = _OP_CODES["send"]
_REDOP_CODES = {name: code for code, name in enumerate(REDOPS)}
SHARED_BIT = 0x80  # set in the op byte when the call runs on shared buffers
#: The op of a revoke frame: a header whose payload is the record of the job's failure
#: (:mod:`cclctl.revocation`), sent on a link instead of the next message.
REVOKE = "revoke"
REVOKE_OP = 0x7E


def comm_tag(comm_id: str) -> int:
    """A 32-bit tag for a communicator id, cheap to compare on every message."""
    return zlib.crc32(comm_id.encode())


# Call and Header are values (never assigned once made, hashed by their fields), yet not
# frozen dataclasses: every call makes a Call, every received message a Header and a Call,
# and a frozen dataclass' __init__ (each field through object.__setattr__) costs about four
# times a plain one's.
@dataclasses.dataclass(slots=True, unsafe_hash=True)
class Call:
    """What a rank is doing: the same on every rank that takes part in one collective."""

    comm: int
    epoch: int
    seq: int
    op: str
    dtype: str = ""
    redop: str = ""
    root: int = -1
    count: int = 0  # 0 for the ops of bandwidth.VARYING: each message's size is checked
    shared: bool = False  # on buffers from cclctl.runtime.transport.shm.shared_buffers (zero-copy)

    def describe(self) -> str:
        return f"{self.what()} at seq {self.seq} epoch {self.epoch}"

    def what(self) -> str:
        """The call without its place: ``all_reduce(float32, sum, count 4096)``."""
        parts = [p for p in (self.dtype, self.redop) if p]
        if self.root >= 0:
            parts.append(f"root {self.root}")
        parts.append(f"count {self.count}" if self.op not in VARYING else "counts by rank")
        if self.shared:
            parts.append("shared buffers")
        return f"{self.op}({', '.join(parts)})"


@dataclasses.dataclass(slots=True, unsafe_hash=True)
class Header:
    call: Call
    step: int
    nbytes: int


def pack_revoke(comm: int, epoch: int, record: bytes) -> bytes:
    """A revoke frame: its header (op :data:`REVOKE_OP`) and the record."""
    header = _HEADER.pack(MAGIC, VERSION, REVOKE_OP, 0, 0, -1, comm, epoch, 0, 0, 0, len(record))
    return header + record


def pack(call: Call, step: int, nbytes: int) -> bytes:
    return _HEADER.pack(
        MAGIC,
        VERSION,
        _OP_CODES.get(call.op, 127) | (SHARED_BIT if call.shared else 0),
        _DTYPE_CODES.get(call.dtype, 0),
        _REDOP_CODES.get(call.redop, 0),
        call.root,
        call.comm,
        call.epoch,
        call.seq,
        step,
        call.count,
        nbytes,
    )


def unpack(data: bytes | bytearray | memoryview, peer: int) -> Header:
    magic, version, op, dtype, redop, root, comm, epoch, seq, step, count, nbytes = _HEADER.unpack(
        data
    )
    if magic != MAGIC or version != VERSION:
        raise ProtocolError(
            f"peer {peer} sent bytes that are not a cclctl message (magic {magic!r}, "
            f"version {version}); is another program using this port?",
            peer=peer,
        )
    shared = bool(op & SHARED_BIT)
    op &= ~SHARED_BIT
    call = Call(
        comm=comm,
        epoch=epoch,
        seq=seq,
        op=COLLECTIVES[op] if op < len(COLLECTIVES) else REVOKE if op == REVOKE_OP else f"op#{op}",
        dtype=DTYPE_NAMES[dtype] if dtype < len(DTYPE_NAMES) else f"dtype#{dtype}",
        redop=REDOPS[redop] if redop < len(REDOPS) else f"redop#{redop}",
        root=root,
        count=count,
        shared=shared,
    )
    return Header(call, step, nbytes)


def _at_step(call: Call, step: int, nbytes: int) -> str:
    return f"{call.what()} step {step} ({nbytes} bytes)"


def check(got: Header, expected: Call, step: int, nbytes: int, rank: int, peer: int) -> None:
    """Refuse a message that belongs to another call, naming what each side called."""
    # A recv's header names the matching send (see _OP_CODES); report the recv as called.
    wanted = dataclasses.replace(expected, op="send") if expected.op == "recv" else expected
    if got.call == wanted and got.step == step and got.nbytes == nbytes:
        return
    hint = ""
    if got.call == wanted:
        why = f"step {got.step} with {got.nbytes} bytes, expected step {step} with {nbytes}"
    else:
        why = f"peer {peer} called {got.call.describe()}"
        if dataclasses.replace(got.call, shared=wanted.shared) == wanted:
            hint = " (pass buffers from comm.empty() on every rank or on none)"
            why += hint
    raise ProtocolError(
        f"collective mismatch: rank {rank} called {expected.describe()} but {why}",
        rank=rank,
        peer=peer,
        seq=expected.seq,
        op=expected.op,
        peer_op=got.call.op,
        peer_seq=got.call.seq,
        mine=expected.what() if got.call != wanted else _at_step(expected, step, nbytes),
        theirs=got.call.what() if got.call != wanted else _at_step(got.call, got.step, got.nbytes),
        hint=hint,
        fault="mismatch" if got.call != wanted else "step_mismatch",
    )
