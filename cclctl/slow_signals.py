"""A rank's slowness signals: rolling per-window summaries of its calls and its peers.

Every rank folds what it does into windows of ``window_s`` seconds (cut on its own wall
clock at multiples of the window since the epoch, so the windows of all ranks line up to
the clock skew) and publishes the complete ones, oldest first, in its status and dumps
(``RankSnapshot.signals``). Per communicator a window holds how many calls ended in it,
the time spent inside them and sampled entry times (``[seq, enter_ns]``), which ranks
compare at equal (comm, seq) to find the one that arrives last; per peer (by job rank) it
holds the payload bytes each way and the time blocked on the peer, split into the wait
before the peer showed any progress in the call (it had not arrived: a straggler's mark)
and the wait after (the data phase), and, over TCP, how long the peer's messages took to
arrive from their first byte to their last (the link's own time, which no wait upstream
of the peer lengthens). The analysis (``diagnose/``) reads them.

Read from other processes' documents, so :func:`signals_from_dict` validates every field
and bounds every size before a reader trusts it (:class:`BadInput`, and
:class:`limits.TooLarge` for a size beyond the bounds below). Standard library only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from cclctl import limits
from cclctl.errors import BadInput

#: Complete windows a document keeps (a minute at the default window of 5 s).
MAX_WINDOWS = 12
#: Sampled entry times per communicator per window (see :func:`sample_entries`).
MAX_ENTRIES = 64
#: Communicators per window; a rank's further communicators are left out of its signals.
MAX_COMMS = 32
#: Peers per window: a rank's windows name only the peers it exchanged bytes with.
MAX_PEERS = 4096
#: The longest communicator id a window may name (ids are short: ``0:0-7``).
MAX_COMM_NAME = 1024
#: The longest window a document may state, in seconds.
MAX_WINDOW_S = 3600.0
#: How a peer is reached.
VIAS = ("shm", "tcp")
#: ``CCLCTL_SLOW_WINDOW``'s default, in seconds.
DEFAULT_WINDOW_S = 5.0


def _fail(where: str, why: str) -> BadInput:
    return BadInput(f"{where}: {why}", where=where)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(data: Mapping[str, Any], key: str, where: str) -> int:
    """A non-negative integer field (0 when absent)."""
    value = data.get(key, 0)
    if type(value) is int and value >= 0:  # what JSON gives: the fast path
        return value
    if not _is_int(value) or value < 0:
        raise _fail(where, f"field {key!r} must be a non-negative integer, got {value!r:.40}")
    return int(value)


def _too_many(where: str, what: str, count: int, limit: int) -> limits.TooLarge:
    return limits.TooLarge(f"{where}: {count:,} {what}, over the limit of {limit:,}", where=where)


#: Fibonacci hashing's multiplier (2**64 over the golden ratio, odd): a seq times it has
#: high bits that spread every arithmetic progression of seqs evenly.
SEQ_HASH = 0x9E3779B97F4A7C15
#: Which bits of the product :func:`seq_hash` keeps: bits 40 to 63 (the low bits of a
#: product keep the seq's own low bits, so they would alias as ``seq % 2**k`` does).
SEQ_HASH_SHIFT = 40


def seq_hash(seq: int) -> int:
    """A fixed hash of ``seq`` whose low ``k`` bits are 0 for one seq in ``2**k`` of every
    run of calls, whatever the position of a call in a training step (``seq % 2**k``
    would keep only the calls at one position of a step of 2 calls)."""
    return (seq * SEQ_HASH >> SEQ_HASH_SHIFT) & 0xFFFFFF


def sample_entries(
    entries: Iterable[tuple[int, int]], limit: int = MAX_ENTRIES
) -> list[tuple[int, int]]:
    """The entries ``(seq, enter_ns)`` whose :func:`seq_hash` has its low ``k`` bits 0,
    for the smallest ``k`` that keeps at most ``limit`` of them, in seq order.

    Deterministic in the seqs alone, so every rank of a communicator keeps the same seqs
    of the calls it started in a window, and their entry times compare one to one; each
    level keeps a subset of the one before, so a window thinned as it fills keeps what
    this keeps.
    """
    kept = sorted(entries)
    mask = 0
    while len(kept) > limit:
        mask = 2 * mask + 1
        kept = [entry for entry in kept if not seq_hash(entry[0]) & mask]
    return kept


@dataclasses.dataclass(slots=True)
class CommWindow:
    """One communicator in one window: ``calls`` that ended in it, ``inside_ns`` spent
    inside its calls in it, and sampled ``entries`` ``(seq, enter_ns)`` of calls that
    started in it (wall clock)."""

    calls: int = 0
    inside_ns: int = 0
    entries: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "inside_ns": self.inside_ns,
            "entries": [[seq, enter_ns] for seq, enter_ns in self.entries],
        }


@dataclasses.dataclass(slots=True)
class PeerWindow:
    """One peer (a job rank) in one window: payload bytes each way, and the time blocked
    on it: ``send_wait_ns``/``recv_wait_ns`` after it had shown progress in the call (the
    data phase), ``entry_wait_ns`` before (it had not arrived yet). ``recv_transfer_ns``:
    the time its messages took to arrive from their first byte to their last, summed over
    the messages that did not arrive whole at once (TCP only; written when not 0)."""

    via: str
    sent: int = 0
    received: int = 0
    send_wait_ns: int = 0
    recv_wait_ns: int = 0
    entry_wait_ns: int = 0
    recv_transfer_ns: int = 0

    def to_dict(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        if not self.recv_transfer_ns:
            del doc["recv_transfer_ns"]
        return doc


@dataclasses.dataclass(slots=True)
class Window:
    """One complete window ``[start_ns, end_ns)`` of this rank's wall clock."""

    start_ns: int
    end_ns: int
    comms: dict[str, CommWindow] = dataclasses.field(default_factory=dict)
    peers: dict[int, PeerWindow] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "comms": {name: comm.to_dict() for name, comm in self.comms.items()},
            "peers": {str(rank): peer.to_dict() for rank, peer in self.peers.items()},
        }


@dataclasses.dataclass(slots=True)
class Signals:
    """A rank's complete windows, oldest first, at most :data:`MAX_WINDOWS`."""

    window_s: float = DEFAULT_WINDOW_S
    windows: list[Window] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"window_s": self.window_s, "windows": [w.to_dict() for w in self.windows]}

    @classmethod
    def from_dict(cls, data: object, where: str = "signals") -> Signals:
        """:func:`signals_from_dict`."""
        return signals_from_dict(data, where)


def _entries_from_list(data: object, where: str) -> list[tuple[int, int]]:
    if not isinstance(data, list):
        raise _fail(where, "field 'entries' must be a list")
    if len(data) > MAX_ENTRIES:
        raise _too_many(where, "entries", len(data), MAX_ENTRIES)
    entries = []
    for pair in data:  # the fast path: pairs of plain non-negative ints, as JSON gives them
        if type(pair) is list and len(pair) == 2:
            seq, enter = pair
            if type(seq) is int and type(enter) is int and seq >= 0 and enter >= 0:
                entries.append((seq, enter))
                continue
        return _entries_checked(data, where)
    return entries


def _entries_checked(data: list[Any], where: str) -> list[tuple[int, int]]:
    """:func:`_entries_from_list` one check at a time, to say what is wrong."""
    entries = []
    for pair in data:
        if not (isinstance(pair, list) and len(pair) == 2 and all(map(_is_int, pair))):
            raise _fail(where, f"an entry must be [seq, enter_ns], got {pair!r:.60}")
        if pair[0] < 0 or pair[1] < 0:
            raise _fail(where, f"an entry has a negative number: {pair!r:.60}")
        entries.append((int(pair[0]), int(pair[1])))
    return entries


def _comm_from_dict(data: object, where: str) -> CommWindow:
    if not isinstance(data, Mapping):
        raise _fail(where, "expected an object")
    return CommWindow(
        calls=_count(data, "calls", where),
        inside_ns=_count(data, "inside_ns", where),
        entries=_entries_from_list(data.get("entries", []), where),
    )


def _peer_from_dict(data: object, where: str) -> PeerWindow:
    if not isinstance(data, Mapping):
        raise _fail(where, "expected an object")
    via = data.get("via")
    if via not in VIAS:
        raise _fail(where, f"field 'via' must be one of {', '.join(VIAS)}, got {via!r:.40}")
    values = [data.get(key, 0) for key in _PEER_COUNTS]
    if all(type(v) is int and v >= 0 for v in values):  # what JSON gives: the fast path
        return PeerWindow(str(via), *values)
    return PeerWindow(str(via), *(_count(data, key, where) for key in _PEER_COUNTS))


_PEER_COUNTS = ("sent", "received", "send_wait_ns", "recv_wait_ns", "entry_wait_ns",
                "recv_transfer_ns")  # fmt: skip


def _peer_rank(key: object, where: str) -> int:
    text = str(key)
    if not (text.isascii() and text.isdigit()) or len(text) > 6:
        raise _fail(where, f"a peer must be a job rank, got {text[:40]!r}")
    return limits.rank(int(text), where, "peer")


def _window_from_dict(data: object, where: str) -> Window:
    if not isinstance(data, Mapping):
        raise _fail(where, "expected an object")
    start, end = data.get("start_ns"), data.get("end_ns")
    if not (_is_int(start) and _is_int(end)) or not 0 <= start < end:  # type: ignore[operator]
        raise _fail(where, f"needs integers 0 <= start_ns < end_ns, got {start!r:.30}, {end!r:.30}")
    comms_raw, peers_raw = data.get("comms", {}), data.get("peers", {})
    if not isinstance(comms_raw, Mapping) or not isinstance(peers_raw, Mapping):
        raise _fail(where, "fields 'comms' and 'peers' must be objects")
    if len(comms_raw) > MAX_COMMS:
        raise _too_many(where, "communicators", len(comms_raw), MAX_COMMS)
    if len(peers_raw) > MAX_PEERS:
        raise _too_many(where, "peers", len(peers_raw), MAX_PEERS)
    comms = {}
    for name, comm in comms_raw.items():
        if not isinstance(name, str) or not 0 < len(name) <= MAX_COMM_NAME:
            raise _fail(where, f"a communicator id must be 1 to {MAX_COMM_NAME} characters")
        comms[name] = _comm_from_dict(comm, f"{where}: comm {name[:40]!r}")
    peers = {}
    for key, peer in peers_raw.items():
        rank = _peer_rank(key, where)
        peers[rank] = _peer_from_dict(peer, f"{where}: peer {rank}")
    return Window(int(start), int(end), comms, peers)  # type: ignore[arg-type]


def signals_from_dict(data: object, where: str = "signals") -> Signals:
    """Validate a document's ``signals`` field and build it; unknown keys are ignored."""
    if not isinstance(data, Mapping):
        raise _fail(where, f"expected an object, got {type(data).__name__}")
    window_s = data.get("window_s", DEFAULT_WINDOW_S)
    if (
        not isinstance(window_s, (int, float))
        or isinstance(window_s, bool)
        or not math.isfinite(window_s)
        or not 0 < window_s <= MAX_WINDOW_S
    ):
        raise _fail(where, f"field 'window_s' must be a number of seconds in (0, {MAX_WINDOW_S:g}]")
    windows_raw = data.get("windows", [])
    if not isinstance(windows_raw, list):
        raise _fail(where, "field 'windows' must be a list")
    if len(windows_raw) > MAX_WINDOWS:
        raise _too_many(where, "windows", len(windows_raw), MAX_WINDOWS)
    windows = [_window_from_dict(w, f"{where}: window {i}") for i, w in enumerate(windows_raw)]
    for i in range(1, len(windows)):
        if windows[i].start_ns < windows[i - 1].end_ns:
            raise _fail(where, f"window {i} starts before window {i - 1} ends (oldest first)")
    return Signals(float(window_s), windows)
