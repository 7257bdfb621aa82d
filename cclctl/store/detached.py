"""The job's store as a process of its own, so it outlives the rank that started it.

Rank 0 of an env-launched job starts ``python -m cclctl.store.detached`` (see
``cclctl/runtime/job/store_process.py``) and writes one JSON line on its stdin: where to
listen, the job's token (never on the command line), the limits and the grace. The process
forks once, so it is nobody's child, points its stdio at /dev/null (its notices: stderr,
which the starter points at the job's folder), binds, answers one line on the pipe it got
as stdout (``{"host", "port", "pid"}``, or ``{"error"}`` naming the address it could not
bind) and closes it, writes its pid file (:mod:`cclctl.store.pidfile`) in the job's
folder, then serves until :class:`~cclctl.store.linger.Linger`'s grace after the last rank
has passed, or until SIGUSR1 (a rerun's rank 0 wanting the port) finds no rank connected.
As it exits it removes the job's token file if it holds its token: the file is there for
``cclctl abort``, ``retry`` and ``top`` to reach this store, and rank 0, which made it,
may be long gone by then (a rerun's file, holding another token, stays).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, BinaryIO

from cclctl import auth
from cclctl.errors import StoreError
from cclctl.store import pidfile
from cclctl.store.limits import StoreLimits
from cclctl.store.linger import Linger
from cclctl.store.server import StoreServer

#: The most a spec line may hold (a token, an address and a few numbers).
MAX_SPEC_BYTES = 4096
#: A store no rank has reached yet declines to leave this long after it started: its
#: job's ranks may still be on their way (two jobs started at once on one port: one fails).
FRESH_S = 10.0


def read_spec(stream: BinaryIO) -> dict[str, Any]:
    """The starter's one line: ``bind``, ``port``, ``token``, ``max_frame``, ``linger_s``,
    ``report_key``, ``job``, ``folder`` (for the pid file; empty: none) and, optional,
    ``first_rank_s`` (see :class:`~cclctl.store.linger.Linger`); a ValueError says
    what is wrong with it."""
    line = stream.readline(MAX_SPEC_BYTES)
    spec = json.loads(line) if line.strip() else None
    if not isinstance(spec, dict):
        raise ValueError("expected one JSON object on stdin")
    kinds = {
        "bind": str, "port": int, "token": str, "max_frame": int, "report_key": str,
        "job": str, "folder": str,
    }  # fmt: skip
    for name, kind in kinds.items():
        if not isinstance(spec.get(name), kind):
            raise ValueError(f"{name} is missing or not a {kind.__name__}")
    if not isinstance(spec.get("linger_s"), (int, float)) or spec["linger_s"] <= 0:
        raise ValueError("linger_s is missing or not a positive number")
    first = spec.setdefault("first_rank_s", 0.0)
    if not isinstance(first, (int, float)) or first < 0:
        raise ValueError("first_rank_s is not a number of seconds")
    return spec


def build(spec: dict[str, Any]) -> StoreServer:
    """The server the spec describes (not started)."""
    return StoreServer(
        spec["bind"],
        spec["port"],
        token=spec["token"] or None,
        limits=StoreLimits(max_frame=spec["max_frame"]),
        linger=Linger(float(spec["linger_s"]), spec["report_key"], float(spec["first_rank_s"])),
    )


def say(fd: int, message: dict[str, Any]) -> None:
    """Write the one answer on the starter's pipe and close it."""
    with os.fdopen(fd, "w") as pipe:
        pipe.write(json.dumps(message) + "\n")


def to_devnull(fd: int) -> None:
    """Point ``fd`` at /dev/null: the starter's pipe is then closed on this side."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, fd)
    os.close(null)


def main() -> int:
    answer = os.dup(1)  # the starter's pipe; stdio itself holds no pipe from here on
    to_devnull(1)
    try:
        spec = read_spec(sys.stdin.buffer)
    except ValueError as exc:
        say(answer, {"error": f"the store process got a bad start line: {exc}"})
        return 2
    to_devnull(0)
    if os.fork() > 0:  # the starter reaps this one at once; the store is orphaned, on purpose
        os._exit(0)
    logging.basicConfig(stream=sys.stderr, format="%(asctime)s pid %(process)d %(message)s")
    server = build(spec)
    try:
        server.start()
    except StoreError as exc:
        fields = {"address": exc.fields.get("address", ""), "errno": exc.fields.get("errno", 0)}
        say(answer, {"error": exc.message, **fields})
        return 1
    say(answer, {"host": server.host, "port": server.port, "pid": os.getpid()})
    log = logging.getLogger("cclctl.store")
    record = {"pid": os.getpid(), "port": server.port, "host": server.host, "job": spec["job"]}
    asked = _answer_leave_requests(server, spec["folder"], record)
    if spec["folder"]:
        try:
            pidfile.write(spec["folder"], record)
        except OSError as exc:
            log.warning("cclctl store %s: no pid file in %s: %s", server.address,
                        spec["folder"], exc.strerror or exc)  # fmt: skip
    log.warning("cclctl store %s: serving, until %gs after the last rank leaves",
                server.address, spec["linger_s"])  # fmt: skip
    server.wait()
    server.close()
    if spec["folder"]:  # the token file rank 0 made goes with the store that needed it
        auth.remove_token_file(spec["folder"], spec["token"])
        pidfile.remove(spec["folder"], server.port, os.getpid())
    if not asked.is_set():
        log.warning("cclctl store %s: no rank for %gs, exiting", server.address, spec["linger_s"])
    return 0


def _answer_leave_requests(
    server: StoreServer, folder: str, record: dict[str, Any]
) -> threading.Event:
    """On SIGUSR1, leave now if no rank of its job uses the store (none connected, or all
    left once: later arrivals are a rerun's); else stay and record the refusal. The event
    is set once the store agreed to leave."""
    asked = threading.Event()
    started = time.monotonic()
    log = logging.getLogger("cclctl.store")

    def on_loop() -> None:
        members = server.members
        fresh = server.member_left == 0 and time.monotonic() - started < FRESH_S
        if server.ended or (members == 0 and not fresh):
            log.warning("cclctl store %s: asked to leave, no rank of its job connected: "
                        "exiting", server.address)  # fmt: skip
            asked.set()
            server.stop_serving()
            return
        why = f"{members} ranks connected" if members else "its ranks have not connected yet"
        log.warning("cclctl store %s: asked to leave, staying: %s", server.address, why)
        if folder:
            pidfile.refuse(folder, record, members)

    signal.signal(signal.SIGUSR1, lambda _signo, _frame: server.call_soon(on_loop) and None)
    return asked


if __name__ == "__main__":
    sys.exit(main())
