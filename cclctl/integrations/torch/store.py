"""An instrumented torch job's place in cclctl's store: live status and job-wide dumps.

``cclctl top --store`` and ``cclctl diagnose hang --store`` read ``cclctl/<job>/status/<rank>``
from a cclctl store, which lists keys by prefix; torch's own TCPStore cannot, so the job gets
a cclctl store beside it, found as :func:`cclctl.config.attach_from_env` says: the one
``cclctl launch`` runs (``CCLCTL_STORE``), else one that rank 0 hosts on ``MASTER_PORT + 1``.
Joining reuses the runtime's rendezvous (world-size agreement, rank claims), so a second job
or a duplicate rank on the same store is caught as it is for cclctl's own runtime.
"""

from __future__ import annotations

import sys

from cclctl.config import RuntimeConfig, attach_from_env
from cclctl.runtime.agent import Agent
from cclctl.runtime.agent.status_link import StatusLink
from cclctl.runtime.job.rendezvous import Rendezvous, join

#: torch's init_process_group has just lined the ranks up, so they reach cclctl's store
#: together; a store that does not answer by then is missing, and the job must not wait.
ATTACH_TIMEOUT_S = 15.0


class StoreAttachment:
    """The rendezvous that placed this rank in the job's store, and the agent's status line
    to that store (its publisher and dump-request poller)."""

    def __init__(self, link: StatusLink, local_rank: int, own: Rendezvous | None) -> None:
        self.rdzv = link.rdzv
        self.link = link
        self.local_rank = local_rank
        self._own = own  # None: another front end of this rank joined the store

    @property
    def address(self) -> str:
        return self.rdzv.store.address

    def close(self) -> None:
        """Leave the store (when this front end joined it); the rank that hosts it waits
        for the others to leave first. The status line is the agent's, which ends it."""
        if self._own is not None:
            self._own.close()


def attach(agent: Agent, cfg: RuntimeConfig, rank: int, world_size: int) -> StoreAttachment | None:
    """Join the job's store and start the agent's status line; None when no store can be
    found. A rank whose agent has a status line already (``cclctl.init()`` joined) uses it."""
    if agent.status is not None:
        return StoreAttachment(agent.status, agent.status.rdzv.local_rank, None)
    where = attach_from_env(rank, world_size)
    if where is None:
        return None
    rdzv = join(where, cfg.replace(connect_timeout_s=min(cfg.connect_timeout_s, ATTACH_TIMEOUT_S)))
    try:
        link = agent.attach(rdzv)
    except BaseException:
        rdzv.close()
        raise
    attachment = StoreAttachment(link, where.local_rank, rdzv)
    if rank == 0:
        print(
            f"cclctl: job {rdzv.job!r} publishes its status to {attachment.address}: "
            f"cclctl top --store {attachment.address} --job {rdzv.job}",
            file=sys.stderr,
            flush=True,
        )
    return attachment
