"""What running a collective again needs, for a retry and a shrink alike: the call's input
kept where the call overwrites it, and what completed calls leave for ranks a fault leaves
behind.

A re-run starts from the input, so a partly reduced buffer is never reduced twice. A fault
can leave the ranks calls apart: where every rank's result is alike (all_reduce,
all_gather, broadcast, barrier) the ranks behind take the kept result of each call the
others completed; where it differs by rank (reduce_scatter, reduce, all_to_all, all_to_allv:
whose every pair exchanges a message, an empty one included) the ranks
ahead run that call once more from a copy of its input, with the ranks behind, and drop
what it gives them (they returned its result already).

How far apart can they be? A call whose result holds every rank's part (:data:`SYNCING`)
tells a rank that completed it that every rank entered it, so none needs an earlier call
again: from there one call is kept, as before. A broadcast or a reduce tells its root
nothing (its sends end in the kernel's buffers), so a run of them can leave ranks any
number of calls apart: each is kept, by seq, up to :data:`KEEP_MAX_BYTES` (beyond the
newest call, always kept); a retry that needs one dropped past that is refused at once.
Each kept call costs one copy, into a buffer a dropped call frees where one fits.

A call of :data:`CONFIRM_FROM` bytes or more of the common collectives (:data:`CONFIRMED`)
keeps nothing: it ends with a confirm (:class:`Ending`), a one-byte recursive-doubling
barrier after its data, so no rank returns from it before every rank's result is whole. A
rank that completed it therefore never leaves another behind that lacks data: a rank a
fault finds still inside it (in the confirm) holds its own complete result and returns it
(:meth:`Kept.hold` marks such a call). That costs a round trip of a byte where a copy of
the buffer cost a memory pass; below the bound the copy is the cheaper.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from cclctl.runtime.algorithms import latency, shared
from cclctl.runtime.algorithms.context import Step
from cclctl.runtime.comm import buffers
from cclctl.runtime.transport.base import Transfer

#: Runs a completed call again from a copy of its input, its result dropped.
Replay = Callable[[np.ndarray], object]
#: What a call's record says of its size: its dtype, count and bytes.
Form = tuple[np.dtype, int, int]

#: How many bytes of completed calls a communicator keeps for ranks a fault left behind,
#: beyond the newest call (always kept, whatever its size).
KEEP_MAX_BYTES = 128 << 20
#: ... and at most this many calls (a run of tiny broadcasts).
KEEP_MAX_CALLS = 1024
#: The calls whose completion here tells that every rank entered them (every rank's part
#: reached this rank's result), so that no rank needs an earlier call again.
SYNCING = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_allv", "barrier")
#: Buffers of dropped calls and of saved inputs held for the next ones, the most recently
#: freed first (a loop's calls reuse them: a fresh buffer's first touch of its pages costs
#: more than the copy), at most this many ...
_FREE_MAX = 8
#: ... and this many bytes beyond the newest (a loop over several buffers keeps them all).
_FREE_MAX_BYTES = 128 << 20
#: The calls that end with a confirm from :data:`CONFIRM_FROM` bytes (their buffer's).
CONFIRMED = ("all_reduce", "all_gather", "broadcast", "reduce_scatter")
#: From this many bytes a call of :data:`CONFIRMED` ends with a confirm instead of keeping
#: a copy of its result (or input) for ranks behind.
CONFIRM_FROM = 1 << 20
#: The confirm's steps are numbered from here, apart from every algorithm's.
CONFIRM_STEP0 = 1 << 24
#: What a kept call's op is marked with where it ended with a confirm (a retry's entry).
HELD_MARK = "*"


@dataclasses.dataclass
class KeptCall:
    """One completed call: its ``seq`` and ``op``, and ``data``: its result where every
    rank holds it alike, else a copy of its input and how to run it again (``replay``)."""

    seq: int
    op: str
    data: np.ndarray | None
    replay: Replay | None = None
    form: Form | None = None  # a held call's size, as its record said

    @property
    def held(self) -> bool:
        """It ended with a confirm: it keeps no data, every rank holds its own result."""
        return self.data is None

    @property
    def label(self) -> str:
        """Its op, marked with :data:`HELD_MARK` where it is :attr:`held`."""
        return self.op + HELD_MARK if self.held else self.op

    def run_again(self) -> None:
        """Run the kept call again from its input (the ranks behind re-run it too)."""
        assert self.replay is not None and self.data is not None
        self.replay(self.data)


class Kept:
    """What this rank keeps of the communicator's completed calls, by seq: contiguous, from
    :attr:`oldest` to :attr:`seq` (none: both 0)."""

    def __init__(self, max_bytes: int = KEEP_MAX_BYTES, max_calls: int = KEEP_MAX_CALLS) -> None:
        self.max_bytes, self.max_calls = max_bytes, max_calls
        self.calls: dict[int, KeptCall] = {}
        self._bytes = 0
        self._free: list[np.ndarray] = []
        self._free_bytes = 0  # the free buffers' bytes, kept as they come and go

    @property
    def seq(self) -> int:
        """The newest kept call's seq (0: none)."""
        return next(reversed(self.calls)) if self.calls else 0

    @property
    def oldest(self) -> int:
        """The oldest kept call's seq (0: none)."""
        return next(iter(self.calls)) if self.calls else 0

    @property
    def result(self) -> np.ndarray | None:
        """The newest call's kept result (None: none, or it kept an input)."""
        last = self.calls.get(self.seq)
        return None if last is None or last.replay is not None else last.data

    def ops(self) -> str:
        """The kept calls' ops, oldest first, comma-separated (what a retry's entry says;
        a call that ended with a confirm marked :data:`HELD_MARK`)."""
        return ",".join(c.label for c in self.calls.values())

    def get(self, seq: int) -> KeptCall | None:
        return self.calls.get(seq)

    def keep(self, seq: int, dst: np.ndarray, op: str = "all_reduce", synced: bool = False) -> None:
        """``dst`` is seq ``seq``'s result, the same on every rank: copy it. ``synced``: the
        call told this rank that every rank entered it (earlier calls are dropped)."""
        self._add(KeptCall(seq, op, dst), synced)

    def keep_input(
        self, seq: int, src: np.ndarray, replay: Replay, op: str = "reduce", synced: bool = False
    ) -> None:
        """Seq ``seq``'s result differs by rank: copy its input ``src``, and ``replay``."""
        self._add(KeptCall(seq, op, src, replay), synced)

    def hold(self, seq: int, op: str, form: Form | None = None) -> None:
        """Seq ``seq`` ended with a confirm: every rank returned from it or holds its whole
        result inside it, so nothing is copied and no rank needs an older call. ``form``:
        its size, for the record that closes it again on a retry."""
        self._add(KeptCall(seq, op, None, form=form), synced=True)

    def borrow(self, arr: np.ndarray) -> np.ndarray:
        """A copy of ``arr`` in a held buffer (an input saved for the call's re-runs);
        :meth:`give_back` it once the call is over."""
        copy = self._buffer(arr)
        copy[...] = arr
        return copy

    def give_back(self, buf: np.ndarray | None) -> None:
        """A buffer :meth:`borrow` lent (or a dropped call held), for the next call to
        reuse; the least recently freed go past :data:`_FREE_MAX` or its bytes."""
        if buf is None:
            return
        free = self._free
        free.insert(0, buf)
        self._free_bytes += buf.nbytes
        while len(free) > _FREE_MAX or self._free_bytes - buf.nbytes > _FREE_MAX_BYTES:
            self._free_bytes -= free.pop().nbytes

    def _add(self, call: KeptCall, synced: bool) -> None:
        calls, arr = self.calls, call.data
        if calls and (synced or call.seq != next(reversed(calls)) + 1):
            self._drop(len(calls))  # none needs the older ones / not contiguous with them
        nbytes = 0 if arr is None else arr.nbytes
        while calls and (self._bytes + nbytes > self.max_bytes or len(calls) >= self.max_calls):
            self._drop(1)
        if arr is not None:
            held = self._buffer(arr)
            held[...] = arr
            call.data = held
        calls[call.seq] = call
        self._bytes += nbytes

    def _drop(self, n: int) -> None:
        """The ``n`` oldest calls go, oldest first, their buffers given back."""
        calls = self.calls
        for _ in range(n):
            dropped = calls.pop(next(iter(calls)))
            if dropped.data is not None:
                self._bytes -= dropped.data.nbytes
                self.give_back(dropped.data)

    def _buffer(self, arr: np.ndarray) -> np.ndarray:
        """A buffer for a copy of ``arr``: a dropped call's where one fits, else new."""
        for i, held in enumerate(self._free):
            if held.shape == arr.shape and held.dtype == arr.dtype:
                self._free_bytes -= held.nbytes
                return self._free.pop(i)
        return np.empty(arr.shape, arr.dtype)


@dataclasses.dataclass
class Inputs:
    """A call's flat input and output, and a copy of the input where the call writes over
    it (in place, or an ``out`` that overlaps it)."""

    src: np.ndarray
    dst: np.ndarray
    saved: np.ndarray | None

    @classmethod
    def of(cls, src: np.ndarray, dst: np.ndarray, spare: Kept | None = None) -> Inputs:
        """From a call's flat views, checked (``dst`` is ``src`` in place); ``spare``: the
        saved input goes into a buffer it lends (else a new one)."""
        saved = None
        if dst is src or buffers.overlaps(src, dst):
            saved = src.copy() if spare is None else spare.borrow(src)
        return cls(src, dst, saved)

    @classmethod
    def kept(cls, dst: np.ndarray) -> Inputs:
        """A call whose input is never written (only its result ``dst`` is)."""
        return cls(dst, dst, None)

    def restore(self) -> None:
        """The input again, for the next attempt."""
        if self.saved is not None:
            self.src[...] = self.saved


class _Confirming(Step):
    """The call's step among ``members`` (virtual ranks 0.. map to them; default: every
    rank), its steps numbered from :data:`CONFIRM_STEP0`, apart from the data's."""

    __slots__ = ("members",)

    def __init__(self, ctx: Step, members: Sequence[int] | None = None) -> None:
        ranks = list(range(ctx.size)) if members is None else list(members)
        super().__init__(
            ctx.transport, ranks.index(ctx.rank), len(ranks), ctx.call, ctx.wait, ctx.scratch
        )
        self.members = ranks

    def xfer(
        self, step: int, sends: Sequence[Transfer] = (), recvs: Sequence[Transfer] = ()
    ) -> None:
        m = self.members
        super().xfer(
            CONFIRM_STEP0 + step,
            [(m[p], view) for p, view in sends],
            [(m[p], view) for p, view in recvs],
        )


def confirm(step: Step) -> None:
    """A one-byte barrier in the call's step: it returns once every rank has entered it.
    Over a transport with a hierarchy (hosts), as the communicator's barrier runs there:
    within each host through its shared memory, across between the hosts' leaders only,
    within again; else recursive doubling among all ranks."""
    token = np.zeros(1, dtype=np.uint8)
    h = step.transport.capabilities.hierarchy
    if h is None:
        latency.all_reduce(_Confirming(step), token, "max")
        return
    if h.group is not None:
        shared.all_reduce(step, h.group, token, token, "max")
    if step.rank == h.leader and len(h.leaders) > 1:
        latency.all_reduce(_Confirming(step, h.leaders), token, "max")
    if h.group is not None:
        shared.broadcast(step, h.group, token, h.leader)


@dataclasses.dataclass
class Ending:
    """How a call ends on this rank, over its attempts: called in the call's step once its
    result is whole in its buffers (``done``), it runs the confirm where ``confirm`` (a
    one-byte barrier: no rank returns before every rank's result is whole)."""

    confirm: bool
    dtype: np.dtype = dataclasses.field(default_factory=lambda: np.dtype(np.uint8))
    done: bool = False
    count: int = 0
    nbytes: int = 0

    @classmethod
    def of(cls, op: str, nbytes: int, dtype: np.dtype) -> Ending:
        """How a call of ``op`` on a buffer of ``nbytes`` and ``dtype`` ends while retry is on."""
        return cls(op in CONFIRMED and nbytes >= CONFIRM_FROM, dtype)

    @property
    def form(self) -> Form:
        """The call's size as its record said (once it ran to its end)."""
        return self.dtype, self.count, self.nbytes

    def __call__(self, step: Step) -> None:
        self.done = True
        rec = step.wait.record
        self.count, self.nbytes = (step.call.count, 0) if rec is None else (rec.count, rec.nbytes)
        if self.confirm and step.size > 1:
            confirm(step)
