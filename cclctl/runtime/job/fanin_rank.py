"""A rank's side of the fan-in rendezvous (:mod:`cclctl.runtime.hostagent.fanin`): its
claim goes to its host's agent, which answers with the job's world document; without an
agent the rank is a group of its own.

The host's first local rank starts the agent here (:func:`~cclctl.runtime.hostagent.spawn.
start_agent`; the status link, which would start it later, knows it is there), so the
agent is there before the claims. The host's other ranks look for its rendezvous socket
until the agent has had its time to start. A rank that finds no agent, whose agent's
connection breaks before it answered (the agent died), or whose agent says its store
requests failed, joins alone, through the same protocol: its claim is the same whichever
way it went, so a claim the agent had already written counts once. An agent that holds the
connection but never answers fails the rank, naming the agent.

The claim also carries what the transport's choice needs (the rank's host key and whether
it asked for TCP), so the world document answers it for every rank; the agent that carried
the claim carries the rank's transport meeting too (:mod:`cclctl.runtime.job.fanin_meeting`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from typing import Any

from cclctl.config import RuntimeConfig, job_dir
from cclctl.errors import RendezvousError
from cclctl.runtime.hostagent import world_doc
from cclctl.runtime.hostagent.address import peer_pid, rendezvous_name, socket_name
from cclctl.runtime.hostagent.fanin import LISTER_GRACE_S, Claim, Where, join_group, run_blocking
from cclctl.runtime.hostagent.fanin_stores import BlockingStore
from cclctl.runtime.hostagent.rendezvous import LENGTH, MAX_ANSWER, MAX_BATCH_S, frame
from cclctl.runtime.hostagent.spawn import START_TIMEOUT_S, start_agent
from cclctl.runtime.hostagent.wire import read_object
from cclctl.runtime.job.token import GIVEN, TokenSource, agree_token, publish_check
from cclctl.runtime.socket_io import connect_unix
from cclctl.runtime.transport.shm.segment import host_key
from cclctl.store.scope import ScopedStore

log = logging.getLogger("cclctl.rendezvous")

#: how long a rank looks for the agent's socket once the agent's starter has its answer
AFTER_START_S = 1.0
#: the agent's answer may come this long after the rank's own rendezvous timeout (its
#: batch's wait, the lister's grace, and a margin)
ANSWER_SLACK_S = MAX_BATCH_S + LISTER_GRACE_S + 5.0
_POLL_S = 0.02


@dataclasses.dataclass(frozen=True)
class Joined:
    """What the rank learnt: every rank's host, pid and host key (equal for ranks that can
    share memory), the ranks that asked for TCP, the agreed token, and whether its host's
    agent carried its claim (``agent``: then that agent's rendezvous socket, which carries
    its transport meeting too)."""

    hosts: list[str]
    pids: list[int]
    token: str
    via_agent: bool
    keys: list[str] = dataclasses.field(default_factory=list)
    tcp: list[int] = dataclasses.field(default_factory=list)
    agent: str = ""


def join_fanin(
    scoped: ScopedStore,
    rank: int,
    world_size: int,
    cfg: RuntimeConfig,
    place: tuple[int, int],
    source: TokenSource | None = None,
) -> Joined:
    """Join through the host's agent (``place``: local rank, local world size), else alone."""
    if rank == 0 and cfg.token:
        publish_check(scoped, cfg.token, cfg.job)
    key, tcp = host_key(), cfg.transport == "tcp"
    claim = {"rank": rank, "pid": os.getpid(), "world_size": world_size,
             "local_world_size": place[1], "timeout_s": cfg.connect_timeout_s, "key": key,
             "tcp": tcp}  # fmt: skip
    answer = _through_agent(claim, cfg, place[0], scoped.address)
    via_agent = answer is not None
    if answer is None:
        alone = [Claim(rank, os.getpid(), world_size, cfg.connect_timeout_s, key, tcp)]
        where = Where(cfg.job, scoped.address)
        answer = run_blocking(join_group(BlockingStore(scoped), cfg.hostname, alone, where))[rank]
    if "error" in answer:
        fields = answer.get("fields") if isinstance(answer.get("fields"), dict) else {}
        raise RendezvousError(str(answer["error"]), **(fields or {}))
    world = world_doc.read(str(answer["world"]).encode(), world_size)
    token = cfg.token
    if rank != 0 and token and answer.get("token_ok") is not True:
        token = agree_token(scoped, source or TokenSource(token, GIVEN, ""), rank, cfg.job,
                            cfg.connect_timeout_s)  # fmt: skip
    agent = rendezvous_name(socket_name(cfg.job, cfg.hostname, scoped.address, cfg.token))
    return Joined(world.hosts, world.pids, token, via_agent, world.keys, world.tcp,
                  agent if via_agent else "")  # fmt: skip


def _through_agent(
    claim: dict[str, Any], cfg: RuntimeConfig, local_rank: int, address: str
) -> dict[str, Any] | None:
    """The agent's answer to ``claim``; None when there is no agent or it died first."""
    name = socket_name(cfg.job, cfg.hostname, address, cfg.token)
    if local_rank == 0:
        start_agent(job=cfg.job, store=address, token=cfg.token, host=cfg.hostname,
                    interval_s=cfg.status_interval_s, folder=cfg.trace_dir or job_dir(cfg.job),
                    metrics=(cfg.metrics_addr, cfg.host_metrics_port))  # fmt: skip
    wait_s = AFTER_START_S + (0.0 if local_rank == 0 else START_TIMEOUT_S)
    sock = _connect(rendezvous_name(name), wait_s)
    if sock is None:
        log.info("cclctl: rank %d found no host agent on %s; it joins alone",
                 claim["rank"], cfg.hostname)  # fmt: skip
        return None
    agent = peer_pid(sock)
    within = float(claim["timeout_s"]) + ANSWER_SLACK_S
    sock.settimeout(within)
    try:
        sock.sendall(frame(claim))
        answer = _answer(sock)
        if "agent_failed" in answer:
            raise ValueError(f"the agent's store requests failed: {answer['agent_failed']}")
        return answer
    except TimeoutError:
        raise RendezvousError(
            f"rank {claim['rank']}: the host agent of {cfg.hostname} (pid {agent}) gave no "
            f"rendezvous answer within {within:g}s",
            rank=claim["rank"],
            agent_pid=agent,
        ) from None
    except (OSError, ValueError) as exc:
        log.warning("cclctl: rank %d lost its host agent (%s pid %d) during the rendezvous "
                    "(%s); it joins alone", claim["rank"], cfg.hostname, agent, exc)  # fmt: skip
        return None
    finally:
        sock.close()


def _connect(name: str, wait_s: float) -> socket.socket | None:
    """A connection to the abstract socket ``name``, looked for up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        sock = connect_unix(name, None)
        if sock is not None:
            return sock
        if time.monotonic() >= deadline:
            return None
        time.sleep(_POLL_S)


def _answer(sock: socket.socket) -> dict[str, Any]:
    return read_object(sock, LENGTH, MAX_ANSWER)
