"""A rank of a job with a sub-communicator: ``ITERS`` in-place all_reduces on the group of
job ranks ``MEMBERS`` (``group`` id ``sub:<folded members>``), then one on the world.

A member prints ``sub <i> <sha256 of the result>`` after each group call, then its group
records ``record <seq> <attempt> <epoch> <state>`` and ``sub_epoch <n>``; every rank then
prints ``world <sha256 of the world's sum>``, its world epoch ``world_epoch <n>`` and
``done``. A failed group call prints ``failed <i> <error>`` and the rank exits 1. Inputs
are :func:`retry_worker.rank_input` of the job rank, so a test computes every sum exactly.

With ``RESET=<job rank>:<group peer>`` that rank, once its first group call has started its
sends to that peer, ends the link with ``shutdown`` (a reset's effect on the socket) from a
thread: the link resumes in the step; each member prints ``resumed <n>`` (its group links'
resumes) before ``sub_epoch``.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import threading
import time
from typing import Any

import numpy as np
from retry_worker import rank_input

import cclctl
from cclctl.config import rendezvous_from_env
from cclctl.errors import CclError
from cclctl.runtime.comm.communicator import Communicator
from cclctl.runtime.job.subgroup import open_subgroup
from cclctl.telemetry.hub import Telemetry

ITERS = int(os.environ.get("ITERS", "3"))
COUNT = int(os.environ.get("COUNT", "65536"))
MEMBERS = [int(r) for r in os.environ["MEMBERS"].split(",")]


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()


def _reset_when_sending(sub: Communicator, peer: int) -> threading.Thread:
    """A thread that shuts the group's link to ``peer`` down once this rank's first call has
    registered its sends to it (the call is under way), then returns."""
    transport: Any = sub.transport  # a TCP transport: CCLCTL_TRANSPORT=tcp
    links = transport._links

    def reset() -> None:
        while transport.link_bytes()[0][peer] == 0:  # no event marks a step's start
            time.sleep(0.0005)
        for other, sock in links.open_links():
            if other == peer:
                sock.shutdown(socket.SHUT_RDWR)

    thread = threading.Thread(target=reset, daemon=True)
    thread.start()
    return thread


def main() -> int:
    world = cclctl.init()
    rank = world.rank
    if rank in MEMBERS:
        sub = open_subgroup(world, rendezvous_from_env().store_address, MEMBERS, "sub")
        x0 = rank_input(rank, COUNT)
        buf = np.empty_like(x0)
        reset = os.environ.get("RESET", "")
        if reset and int(reset.split(":")[0]) == rank:
            _reset_when_sending(sub, int(reset.split(":")[1]))
        for i in range(ITERS):
            buf[:] = x0
            try:
                sub.all_reduce(buf)
            except CclError as exc:
                print(f"failed {i} {exc}", flush=True)
                print(f"rank {rank} failed: {exc}", file=sys.stderr, flush=True)
                return 1
            print(f"sub {i} {_digest(buf)}", flush=True)
        tracer = world.tracer
        assert isinstance(tracer, Telemetry)
        for rec in sorted(tracer.records(), key=lambda r: (r.seq, r.attempt)):
            if rec.comm == sub.id:
                print(f"record {rec.seq} {rec.attempt} {rec.epoch} {rec.state}", flush=True)
        resumed = sum(sub.transport._links.resumed)
        print(f"resumed {resumed}", flush=True)
        print(f"sub_epoch {sub.failure.epoch}", flush=True)
        sub.close()
    total = rank_input(rank, COUNT)
    world.all_reduce(total)
    print(f"world {_digest(total)}", flush=True)
    print(f"world_epoch {world.failure.epoch}", flush=True)
    world.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
