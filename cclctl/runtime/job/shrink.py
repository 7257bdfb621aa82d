"""The survivors' agreement on a shrink, in the job's store: who is in, never waiting on the dead.

Shrink ``n`` (the new communicator's creation index) lives under ``shrink/<n>/``. Every
survivor writes ``shrink/<n>/in/<rank>`` (its rank in the old communicator, its last
completed seq, its last kept call's seq and the call it was in), then waits until
every rank not excluded wrote it or the deadline passes: the dead origin of the revoke
record is excluded from the start, so nobody waits on it, and a rank silent past the
deadline (stopped, frozen) is excluded too. Then each survivor proposes the ranks it saw
to ``shrink/<n>/members`` by compare-and-set: the first proposal wins and every survivor
builds the communicator it names (a survivor left out of it fails, saying so). The new
transport's rendezvous (:class:`ShrinkExchange`) is scoped under the same prefix.
"""

from __future__ import annotations

import dataclasses
import json
import time

from cclctl.errors import CommError, RendezvousError, StoreTimeout
from cclctl.ranges import fold_ranks
from cclctl.runtime.job.store_exchange import StoreExchange
from cclctl.store.scope import ScopedStore

#: How often a survivor waiting for the others looks whether one already decided.
POLL_S = 0.05


@dataclasses.dataclass(frozen=True)
class Joined:
    """One survivor's entry: its old rank, last completed seq, last kept call's seq,
    and the call a dead rank interrupted ("" for an explicit ``shrink()``)."""

    rank: int
    done: int
    kept: int
    call: str = ""

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()


@dataclasses.dataclass(frozen=True)
class Agreement:
    """The decided shrink: ``members`` are old ranks in order (new rank = index)."""

    n: int
    members: list[int]
    entries: dict[int, Joined]


def agree(
    scoped: ScopedStore,
    n: int,
    world_size: int,
    mine: Joined,
    excluded: frozenset[int],
    timeout_s: float,
) -> Agreement:
    """Join shrink ``n`` of a communicator of ``world_size`` ranks and return what was
    decided; ``excluded`` ranks are never waited on, others at most ``timeout_s``."""
    prefix = f"shrink/{n}/"
    scoped.set(f"{prefix}in/{mine.rank}", mine.encode())
    expected = [r for r in range(world_size) if r not in excluded]
    keys = [f"{prefix}in/{r}" for r in expected]
    deadline = time.monotonic() + timeout_s
    decided = scoped.try_get(f"{prefix}members")
    while decided is None and time.monotonic() < deadline:
        try:
            scoped.wait(keys, timeout_s=max(0.0, min(POLL_S, deadline - time.monotonic())))
            break
        except StoreTimeout:
            decided = scoped.try_get(f"{prefix}members")
    if decided is None:
        decided = scoped.compare_set(f"{prefix}members", None, _proposal(scoped, prefix, excluded))
    agreement = _decode(n, decided)
    if mine.rank not in agreement.members:
        raise CommError(
            f"rank {mine.rank}: left out of shrink {n}: the survivors agreed on ranks "
            f"{fold_ranks(agreement.members)} before it joined",
            rank=mine.rank,
        )
    return agreement


def _proposal(scoped: ScopedStore, prefix: str, excluded: frozenset[int]) -> bytes:
    """Every entry written so far by a rank not excluded: this survivor's proposal."""
    entries = []
    for raw in scoped.list(f"{prefix}in/").values():
        entry = Joined(**json.loads(raw))
        if entry.rank not in excluded:
            entries.append(dataclasses.asdict(entry))
    entries.sort(key=lambda e: int(e["rank"]))
    return json.dumps({"entries": entries}).encode()


def _decode(n: int, raw: bytes) -> Agreement:
    entries = [Joined(**e) for e in json.loads(raw)["entries"]]
    return Agreement(n, [e.rank for e in entries], {e.rank: e for e in entries})


class ShrinkExchange(StoreExchange):
    """The new transport's rendezvous: publish a value, get every survivor's, by new rank,
    under ``shrink/<n>/x/`` (a key again starts a new round, as in the job's rendezvous)."""

    def __init__(
        self,
        scoped: ScopedStore,
        n: int,
        rank: int,
        world_size: int,
        timeout_s: float,
        prefix: str = "",
    ) -> None:
        """``prefix``: where the rounds live (a retry's own; default ``shrink/<n>/x/``)."""

        def missing(key: str, ranks: list[int]) -> RendezvousError:
            return RendezvousError(
                f"shrink exchange {key!r} timed out after {timeout_s:g}s: new ranks "
                f"{fold_ranks(ranks)} of {world_size} never arrived",
                missing=fold_ranks(ranks),
            )

        super().__init__(scoped, prefix or f"shrink/{n}/x/", rank, world_size, timeout_s, missing)
