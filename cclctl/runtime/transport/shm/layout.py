"""Where everything sits in a rank's segment, and the views a rank keeps of each segment.

Every counter in a segment is written by its owner only (so no atomics are needed: an
aligned 8-byte store is atomic) and read by the peers; the one exception is the ``wake``
futex word that peers bump to wake a sleeping owner. Counters that different ranks poll
sit on separate cache lines. Data slots start on 64-byte boundaries, so a slot can be
viewed as any dtype without copies.

Layout (L local ranks, K collective slots of C bytes, KP point-to-point slots of CP bytes)::

    control     magic, pid, state, cross-memory probe | wake | sleeping | collective counters
                | per peer: sent, received
                | revoke: length, then the record of this rank's first failure
    coll[K]     header + C bytes: this rank's published chunk of a collective (read by all)
    res[K]      header + C bytes: this rank's reduced sub-chunk (reduce-scatter + all-gather)
    p2p[L][KP]  header + CP bytes: point-to-point messages to local rank j
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from cclctl.runtime.transport.shm.futex import address_of
from cclctl.runtime.transport.shm.segment import Segment

LINE = 64
HEADER = 64  # slot header: the 44-byte wire header, padded to a cache line
MAGIC = 0x534C4343  # "CCLS"
MASK32 = 0xFFFFFFFF

# u32 words
W_MAGIC, W_PID, W_STATE = 0, 1, 2
W_CROSS = 8  # whether this rank read every peer's probe token through the kernel
# u64 words of the first line: the cross-memory probe (shm/cross_memory.py)
Q_PROBE_ADDR, Q_PROBE_TOKEN = 2, 3
W_WAKE = LINE // 4
W_SLEEPING = 2 * LINE // 4
# u64 counters
Q_COLL_PUB = 3 * LINE // 8  # collective rounds whose input chunk this rank published
Q_COLL_USED = Q_COLL_PUB + 1  # rounds whose every peer input this rank has finished reading
Q_RES_PUB = Q_COLL_PUB + 2  # rounds whose reduced sub-chunk this rank published
Q_RES_USED = Q_COLL_PUB + 3  # rounds whose every reduced sub-chunk this rank has read

STATE_OK, STATE_CLOSED, STATE_BROKEN = 0, 1, 2
_P2P_BASE = 4 * LINE
REVOKE_BYTES = 2048  # the revoke area: a u32 length, then the record (cclctl.revocation)


@dataclasses.dataclass(frozen=True)
class Layout:
    local_size: int
    slots: int = 4
    slot_bytes: int = 1 << 20
    p2p_slots: int = 4
    p2p_bytes: int = 256 << 10

    def q_sent(self, j: int) -> int:
        """Counter: point-to-point chunks this rank wrote for local rank ``j``."""
        return (_P2P_BASE + 2 * j * LINE) // 8

    def q_received(self, j: int) -> int:
        """Counter: point-to-point chunks this rank consumed from local rank ``j``."""
        return (_P2P_BASE + (2 * j + 1) * LINE) // 8

    @property
    def revoke_area(self) -> int:
        """Byte offset of the revoke area: written once by the owner before it sets its
        state to broken, read by peers once they see that state."""
        return _P2P_BASE + 2 * self.local_size * LINE

    @property
    def control_bytes(self) -> int:
        raw = self.revoke_area + REVOKE_BYTES
        return -(-raw // 4096) * 4096

    def coll_slot(self, k: int) -> int:
        return self.control_bytes + (k % self.slots) * (HEADER + self.slot_bytes)

    def res_slot(self, k: int) -> int:
        return self.control_bytes + (self.slots + k % self.slots) * (HEADER + self.slot_bytes)

    def p2p_slot(self, j: int, k: int) -> int:
        base = self.control_bytes + 2 * self.slots * (HEADER + self.slot_bytes)
        return base + (j * self.p2p_slots + k % self.p2p_slots) * (HEADER + self.p2p_bytes)

    @property
    def size(self) -> int:
        return self.p2p_slot(self.local_size, 0)


class View:
    """One mapped segment as counters (u64), words (u32), bytes and a numpy byte array."""

    __slots__ = ("i", "mv", "pidfd", "q", "rank", "revoke", "segment", "u8", "wake_addr")

    def __init__(self, segment: Segment, layout: Layout, rank: int) -> None:
        self.segment = segment
        self.rank = rank  # global rank of the owner
        self.mv = memoryview(segment.mm)
        control = self.mv[: layout.control_bytes]
        self.q = control.cast("Q")
        self.i = control.cast("I")
        self.u8 = np.frombuffer(segment.mm, np.uint8)
        self.revoke = self.mv[layout.revoke_area : layout.revoke_area + REVOKE_BYTES]
        self.wake_addr = address_of(self.mv, W_WAKE * 4)
        self.pidfd: int | None = None

    def init_owner(self) -> None:
        self.i[W_PID] = os.getpid() & MASK32
        self.i[W_STATE] = STATE_OK
        self.i[W_MAGIC] = MAGIC

    def valid(self) -> bool:
        return self.i[W_MAGIC] == MAGIC

    def write_revoke(self, record: bytes) -> None:
        """The owner: leave the record of its first failure for its peers (before it sets
        its state word, which is what they look at)."""
        record = record[: REVOKE_BYTES - 4]
        self.revoke[4 : 4 + len(record)] = record
        self.revoke[:4] = len(record).to_bytes(4, "little")

    def read_revoke(self) -> bytes:
        """A peer: the owner's record, or empty when it left none."""
        n = min(int.from_bytes(self.revoke[:4], "little"), REVOKE_BYTES - 4)
        return bytes(self.revoke[4 : 4 + n])

    def release(self) -> None:
        """Drop every view of the mapping so the segment can be unmapped."""
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        for view in (self.q, self.i, self.revoke, self.mv):
            view.release()
        self.u8 = np.empty(0, np.uint8)
        self.segment.close()
