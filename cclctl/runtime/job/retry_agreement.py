"""A retry's agreement in the job's store: every rank's entry, and what ends the wait early.

Each rank of the communicator writes what it brings (:class:`~cclctl.runtime.comm.recovery.
retry_rules.Ask`) under ``<prefix>in/<rank>`` and waits for every rank's until the budget's
deadline (:func:`agree`). While it waits it looks, every :data:`AGREE_LOOK_S`, at what
says the others will never come: the job's record of a failure no retry recovers from (a
hang, an abort, a member's death: :func:`job_failure`), or a rank that closed for good
(``retry/<comm>/left/<rank>``). :func:`gone` says whether a rank's process on this host is
gone (a sub-communicator's ranks map to job ranks through its members).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

from cclctl import revocation
from cclctl.errors import CommError, StoreTimeout
from cclctl.ranges import fold_ranks
from cclctl.runtime.comm.recovery.port import Port
from cclctl.runtime.comm.recovery.retry_rules import RETRIED_KINDS, Ask
from cclctl.runtime.job.revoke_key import read_record
from cclctl.store.scope import ScopedStore

#: How often a rank waiting for the others' entries looks at the job's record.
AGREE_LOOK_S = 0.25


def agree(scoped: ScopedStore, prefix: str, comm: Port, ask: Ask) -> dict[int, Ask]:
    """Write this rank's entry, wait for every rank's until the deadline, read them all.
    While it waits, the job's record may show that the job failed otherwise (a hang, a
    death, an abort): then the others never come, and that failure is raised at once."""
    rank, size = comm.rank, comm.world_size
    mine = dataclasses.asdict(ask)
    scoped.set(f"{prefix}in/{rank}", json.dumps(mine).encode())
    keys = [f"{prefix}in/{r}" for r in range(size)]
    while True:
        left = ask.deadline - time.monotonic()
        try:
            scoped.wait(keys, timeout_s=max(0.0, min(left, AGREE_LOOK_S)))
            break
        except StoreTimeout:
            failed = job_failure(scoped, comm)
            if failed is not None:
                where = f"rank {rank}: retry of {ask.call} seq {ask.pending}"
                raise comm.failure.error(failed, where) from None
            _left_for_good(scoped, comm, keys, rank, ask)
            if left > AGREE_LOOK_S:
                continue
            present = scoped.list(f"{prefix}in/")
            missing = [r for r, k in enumerate(keys) if k not in present]
            raise CommError(
                f"rank {rank}: retry of seq {ask.pending}: rank(s) {fold_ranks(missing)} did "
                "not join before the budget ran out",
                rank=rank,
            ) from None
    found = scoped.list(f"{prefix}in/")
    return {r: Ask(**json.loads(found[k])) for r, k in enumerate(keys)}


def _left_for_good(scoped: ScopedStore, comm: Port, keys: list[str], rank: int,
                   ask: Ask) -> None:  # fmt: skip
    """Raise at once where a rank the agreement waits for closed for good (it gave up
    waiting at its close, or a failure ended its waiting): it will never join."""
    present = scoped.list(f"{_agreement(keys)}")
    gone = scoped.list(f"retry/{comm.id}/left/")
    left = sorted(r for r, k in enumerate(keys) if k not in present
                  and f"retry/{comm.id}/left/{r}" in gone)  # fmt: skip
    if not left:
        return
    after = max(Ask(**json.loads(gone[f"retry/{comm.id}/left/{r}"])).pending - 1 for r in left)
    raise CommError(
        f"rank {rank}: cannot retry seq {ask.pending}: rank(s) {fold_ranks(left)} closed "
        f"after seq {after}, before the fault reached them, and left (they waited for "
        "every rank to close until the budget ran out, or the job failed otherwise)",
        rank=rank,
    )


def _agreement(keys: list[str]) -> str:
    """The prefix of an agreement's entry keys (``.../in/``)."""
    return keys[0].rpartition("/")[0] + "/"


def gone(comm: Port, rank: int) -> bool:
    """Rank ``rank``'s process (its job rank's: ``comm.members``) ran on this host and is gone."""
    peers, host = comm.failure.peers, comm.failure.host
    if not 0 <= rank < comm.world_size or rank == comm.rank or not host:
        return False
    job_rank = comm.members[rank]
    if not 0 <= job_rank < len(peers) or peers[job_rank][0] != host:
        return False
    try:
        os.kill(peers[job_rank][1], 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def job_failure(scoped: ScopedStore, comm: Port) -> revocation.Revocation | None:
    """The job's record where it is a failure that a retry of ``comm`` does not recover
    from (the ranks it stopped do not join): one of ``comm``'s present life (an operator's of
    any epoch), or the death of one of its members, whatever communicator saw it (a dead
    rank never joins; a sub-communicator's records are the world's)."""
    rev = read_record(scoped)
    if rev is None or rev.kind in RETRIED_KINDS:
        return None
    if rev.of_life(comm.id, comm.failure.epoch):
        return rev
    return rev if rev.kind == "died" and rev.origin in comm.members else None
