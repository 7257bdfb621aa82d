"""What runs each collective: one decision per communicator from op, size, engines and
``CCLCTL_ALGO``.

Every op has a small- and a large-message algorithm and a threshold between them. On a
transport with an engine (:class:`~cclctl.runtime.transport.capabilities.Capabilities`)
each runs there: one-copy shared memory (``shm_direct``; ``shm_rsag`` for large messages,
from 1 MiB with 2 ranks), single-copy through the kernel where it lets the host's ranks
reach each other's memory (``shm_cma``, :data:`SINGLE_COPY_FROM`), zero-copy on shared
buffers from
:data:`ZERO_COPY_MIN_BYTES` (``shm_zero_copy``, :data:`ZERO_COPY_FROM`), or within
hosts then across (``hier_rd``, ``hier_ring``; ``hier_cma`` where a host's ranks reach each
other's memory: its phases single-copy).

``CCLCTL_ALGO`` is a comma list: ``ring`` runs ring wherever an op has it and
``all_reduce=rd,broadcast=chain`` per op, as named, over point-to-point steps on any
transport; ``all_reduce>=1M=ring`` sets the size from which the large-message algorithm
replaces the small one (on the engine, when there is one).
"""

from __future__ import annotations

import dataclasses

from cclctl.errors import ConfigError
from cclctl.runtime.transport.capabilities import Capabilities

#: op -> (small-message algorithm, large-message algorithm, default threshold in bytes)
ALGORITHMS: dict[str, tuple[str, str, int]] = {
    "all_reduce": ("rd", "ring", 64 << 10),
    "broadcast": ("tree", "chain", 256 << 10),
    "reduce": ("tree", "ring", 64 << 10),
    "all_gather": ("ring", "ring", 0),
    "reduce_scatter": ("ring", "ring", 0),
    "all_to_all": ("pairwise", "pairwise", 0),
    "all_to_allv": ("pairwise", "pairwise", 0),
}
#: Ops whose size differs by rank: every rank must choose alike, so they choose by their
#: engines alone (:meth:`Choice.alike`) and take no size threshold.
BY_ENGINE_ONLY = ("all_to_allv",)
#: Ops whose ring needs at least one element per rank (smaller calls run the small one).
_RING_NEEDS_ELEMENTS = ("all_reduce", "reduce")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
NEVER = 1 << 62  # a threshold no call reaches
#: The collectives that run zero-copy on shared buffers, from this many bytes (a call has
#: the same size on every rank, so every rank decides alike). Below it, publishing
#: descriptors and the extra synchronisations cost more than the copy they save.
ZERO_COPY_MIN_BYTES = 256 << 10
ZERO_COPY_FROM = dict.fromkeys(
    ("all_reduce", "all_gather", "reduce_scatter", "broadcast"), ZERO_COPY_MIN_BYTES
)
#: The collectives that run single-copy on plain buffers (``shm_cma``: ranks read and
#: write each other's arrays through the kernel) where the transport's cross-memory engine
#: is there, from this many bytes (an all_gather's output): below, a system call per peer
#: and piece and a second synchronisation cost about what the pass through the slots they
#: save does (2 ranks: 0.98-1.03x at 256-512 KiB, 1.4-1.6x at 1 MiB). An all_to_all runs it
#: at every size: its alternative, pairwise steps over the point-to-point rings, was 2.5-3.6x
#: slower from 1 KiB to 8 KiB and more above. A broadcast keeps its slots: there the root's
#: copy into them overlaps the readers' copies out, which one read through the kernel
#: (slower than a plain copy: it pins the pages) did not beat.
SINGLE_COPY = "shm_cma"
SINGLE_COPY_MIN_BYTES = 1 << 20
SINGLE_COPY_FROM = {
    **dict.fromkeys(("all_reduce", "all_gather", "reduce_scatter"), SINGLE_COPY_MIN_BYTES),
    "all_to_all": 0,
    "all_to_allv": 0,
}
#: Where 2 ranks on one host switch from reducing everything (``shm_direct``: one
#: synchronisation per round) to reducing half each (``shm_rsag``: two, half the adds).
TWO_RANK_RSAG_FROM = 1 << 20


@dataclasses.dataclass(frozen=True)
class Selection:
    """``CCLCTL_ALGO`` parsed: algorithms forced per op, and thresholds moved per op."""

    forced: dict[str, str] = dataclasses.field(default_factory=dict)
    thresholds: dict[str, int] = dataclasses.field(default_factory=dict)

    def choose(self, op: str, nbytes: int) -> str:
        """The point-to-point algorithm for ``op`` on ``nbytes`` (engines aside)."""
        forced = self.forced.get(op)
        if forced:
            return forced
        small, large, default = ALGORITHMS[op]
        return large if nbytes >= self.thresholds.get(op, default) else small


@dataclasses.dataclass(frozen=True, slots=True)
class Choice:
    """What runs one op on one communicator: ``small`` below ``threshold`` bytes or
    ``min_count`` elements, else ``large`` (``uneven`` where the count does not split into
    ``parts`` equal blocks), and plain buffers single-copy from ``single_copy_from`` bytes;
    shared buffers run zero-copy from ``zero_copy_from`` bytes."""

    small: str
    large: str
    threshold: int
    min_count: int = 0
    parts: int = 1
    uneven: str = ""
    zero_copy_from: int = NEVER
    single_copy_from: int = NEVER

    def pick(self, nbytes: int, count: int) -> str:
        if nbytes >= self.single_copy_from:
            return SINGLE_COPY
        if nbytes < self.threshold or count < self.min_count:
            return self.small
        return self.uneven if count % self.parts else self.large

    def alike(self) -> str:
        """The choice of an op whose size differs by rank (:data:`BY_ENGINE_ONLY`): single-copy
        where the engine is there, else the large algorithm."""
        return SINGLE_COPY if self.single_copy_from < NEVER else self.large


@dataclasses.dataclass(frozen=True, slots=True)
class Choices:
    """Every op's :class:`Choice` on one communicator (``barrier`` is a one-byte all_reduce)."""

    all_reduce: Choice
    broadcast: Choice
    reduce: Choice
    all_gather: Choice
    reduce_scatter: Choice
    all_to_all: Choice
    all_to_allv: Choice
    barrier: Choice


def decide(sel: Selection, caps: Capabilities, world_size: int) -> Choices:
    """Every op's choice on a communicator of ``world_size`` ranks over a transport with
    ``caps``, zero-copy included. Ranks with the same configuration and transport decide
    alike."""
    ops = {op: _choice(sel, op, caps, world_size) for op in ALGORITHMS}
    barrier = _on_engine("all_reduce", "rd", caps, world_size)
    return Choices(**ops, barrier=Choice(barrier, barrier, NEVER))


def _choice(sel: Selection, op: str, caps: Capabilities, n: int) -> Choice:
    small, large, default = ALGORITHMS[op]
    min_count = n if op in _RING_NEEDS_ELEMENTS else 0
    forced = sel.forced.get(op)
    if forced is not None:  # as named, point-to-point; ring falls back as it must
        if forced == small:
            return Choice(small, small, NEVER)
        return Choice(small, forced, 0, min_count)
    if op == "all_reduce" and caps.one_copy is not None and n == 2:
        default = TWO_RANK_RSAG_FROM
    threshold = sel.thresholds.get(op, default)
    engine_large = _on_engine(op, large, caps, n)
    even = op == "reduce" and engine_large != large  # one-copy reduce-scatter: equal blocks
    return Choice(
        _on_engine(op, small, caps, n),
        engine_large,
        threshold,
        min_count,
        parts=n if even else 1,
        uneven=large if even else engine_large,
        zero_copy_from=NEVER if caps.one_copy is None else ZERO_COPY_FROM.get(op, NEVER),
        single_copy_from=NEVER if caps.cross_memory is None else SINGLE_COPY_FROM.get(op, NEVER),
    )


def _on_engine(op: str, algo: str, caps: Capabilities, n: int) -> str:
    """What runs ``algo`` for ``op`` on the engine ``caps`` offer (``algo`` itself where none)."""
    if caps.one_copy is not None:
        if op == "all_reduce":
            return "shm_rsag" if algo == "ring" else "shm_direct"
        if op in ("broadcast", "all_gather", "reduce_scatter") or (op, algo) == ("reduce", "ring"):
            return "shm_direct"
    if caps.hierarchy is not None and op == "all_reduce":
        if algo != "ring":
            return "hier_rd"
        return "hier_ring" if caps.hierarchy.cross_memory is None else "hier_cma"
    return algo


def parse_bytes(text: str) -> int:
    """Bytes in ``text``: a number with an optional unit K, M or G (binary; ``KiB`` and ``KB``
    read alike). Raises ValueError."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1:] if text[-1:] in _UNITS else ""
    return int(float(text[: len(text) - len(unit)]) * _UNITS[unit])


def parse(spec: str) -> Selection:
    """``CCLCTL_ALGO`` as a :class:`Selection`; raises ConfigError naming the bad item."""
    forced: dict[str, str] = {}
    thresholds: dict[str, int] = {}
    for raw in filter(None, (item.strip() for item in spec.split(","))):
        try:
            _parse_item(raw, forced, thresholds)
        except ValueError as exc:
            raise ConfigError(f"CCLCTL_ALGO item {raw!r}: {exc}", variable="CCLCTL_ALGO") from None
    return Selection(forced, thresholds)


def _parse_item(raw: str, forced: dict[str, str], thresholds: dict[str, int]) -> None:
    if "=" not in raw:
        names = {op for op, algos in ALGORITHMS.items() if raw in algos[:2]}
        if not names:
            raise ValueError(f"no collective has an algorithm called {raw!r}")
        forced.update(dict.fromkeys(names, raw))
        return
    key, algo = (p.strip() for p in raw.rsplit("=", 1))
    op, _, size = key.partition(">=")
    op = op.strip()
    if op not in ALGORITHMS:
        raise ValueError(f"unknown collective {op!r}")
    small, large, _ = ALGORITHMS[op]
    if algo not in (small, large):
        raise ValueError(f"{op} has no algorithm {algo!r} (has {small}, {large})")
    if not size:
        forced[op] = algo
    elif op in BY_ENGINE_ONLY:
        raise ValueError(f"{op} takes no size threshold: its size differs by rank")
    elif algo != large:
        raise ValueError(f"a size threshold selects {large!r} for {op}")
    else:
        thresholds[op] = parse_bytes(size)
