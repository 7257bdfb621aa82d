"""The job's store as a process of its own, so it outlives the rank that started it.

Rank 0 of an env-launched job starts ``python -m cclctl.store.detached`` (see
``cclctl/runtime/job/store_process.py``) and writes one JSON line on its stdin: where to
listen, the job's token (never on the command line), the limits and the grace. The process
forks once, so it is nobody's child, points its stdio at /dev/null (its notices: stderr,
which the starter points at the job's folder), binds, answers one line on the pipe it got
as stdout (``{"host", "port", "pid"}``, or ``{"error"}`` naming the address it could not
bind) and closes it, then serves until :class:`~cclctl.store.linger.Linger`'s grace after
the last rank has passed.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any, BinaryIO

from cclctl.errors import StoreError
from cclctl.store.limits import StoreLimits
from cclctl.store.linger import Linger
from cclctl.store.server import StoreServer

#: The most a spec line may hold (a token, an address and a few numbers).
MAX_SPEC_BYTES = 4096


def read_spec(stream: BinaryIO) -> dict[str, Any]:
    """The starter's one line: ``bind``, ``port``, ``token``, ``max_frame``, ``linger_s``,
    ``report_key``; a ValueError says what is wrong with it."""
    line = stream.readline(MAX_SPEC_BYTES)
    spec = json.loads(line) if line.strip() else None
    if not isinstance(spec, dict):
        raise ValueError("expected one JSON object on stdin")
    kinds = {"bind": str, "port": int, "token": str, "max_frame": int, "report_key": str}
    for name, kind in kinds.items():
        if not isinstance(spec.get(name), kind):
            raise ValueError(f"{name} is missing or not a {kind.__name__}")
    if not isinstance(spec.get("linger_s"), (int, float)) or spec["linger_s"] <= 0:
        raise ValueError("linger_s is missing or not a positive number")
    return spec


def build(spec: dict[str, Any]) -> StoreServer:
    """The server the spec describes (not started)."""
    return StoreServer(
        spec["bind"],
        spec["port"],
        token=spec["token"] or None,
        limits=StoreLimits(max_frame=spec["max_frame"]),
        linger=Linger(float(spec["linger_s"]), spec["report_key"]),
    )


def _say(fd: int, message: dict[str, Any]) -> None:
    """Write the one answer on the starter's pipe and close it."""
    with os.fdopen(fd, "w") as pipe:
        pipe.write(json.dumps(message) + "\n")


def _to_devnull(fd: int) -> None:
    """Point ``fd`` at /dev/null: the starter's pipe is then closed on this side."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, fd)
    os.close(null)


def main() -> int:
    answer = os.dup(1)  # the starter's pipe; stdio itself holds no pipe from here on
    _to_devnull(1)
    try:
        spec = read_spec(sys.stdin.buffer)
    except ValueError as exc:
        _say(answer, {"error": f"the store process got a bad start line: {exc}"})
        return 2
    _to_devnull(0)
    if os.fork() > 0:  # the starter reaps this one at once; the store is orphaned, on purpose
        os._exit(0)
    logging.basicConfig(stream=sys.stderr, format="%(asctime)s pid %(process)d %(message)s")
    server = build(spec)
    try:
        server.start()
    except StoreError as exc:
        _say(answer, {"error": exc.message, "address": exc.fields.get("address", "")})
        return 1
    _say(answer, {"host": server.host, "port": server.port, "pid": os.getpid()})
    log = logging.getLogger("cclctl.store")
    log.warning("cclctl store %s: serving, until %gs after the last rank leaves",
                server.address, spec["linger_s"])  # fmt: skip
    server.wait()
    server.close()
    log.warning("cclctl store %s: no rank for %gs, exiting", server.address, spec["linger_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
