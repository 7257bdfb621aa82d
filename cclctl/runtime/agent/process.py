"""The agent of this process, one per rank: every front end gets it from :func:`for_process`.

Keyed by process id and rank: a forked child (a data loader worker) starts with no agent,
and a test that runs several ranks as threads of one process gets one agent per rank.
"""

from __future__ import annotations

import os
import threading

from cclctl.config import RuntimeConfig
from cclctl.runtime.agent.agent import Agent

_agents: dict[tuple[int, int], Agent] = {}
_lock = threading.Lock()


def for_process(
    cfg: RuntimeConfig,
    rank: int,
    world_size: int,
    local_rank: int = 0,
    backend: str = "cclctl",
) -> Agent:
    """The agent of rank ``rank`` in this process, made by the first front end that asks
    (with its ``cfg``); every call counts one user, to :meth:`Agent.release` once."""
    key = (os.getpid(), rank)
    with _lock:
        agent = _agents.get(key)
        if agent is None or agent.closed:
            agent = _agents[key] = Agent(cfg, rank, world_size, local_rank, backend)
        return agent.acquire()


def current(rank: int) -> Agent | None:
    """The live agent of rank ``rank`` in this process, if a front end made one."""
    with _lock:
        agent = _agents.get((os.getpid(), rank))
    return agent if agent is not None and not agent.closed else None
