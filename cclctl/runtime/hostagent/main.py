"""The host agent as a process of its own: ``python -m cclctl.runtime.hostagent.main``.

The host's first local rank starts it (:mod:`.spawn`) and writes one JSON line on its
stdin: the job, the store's address, the token (never on the command line), the host's
name and the status interval. Like the job's store it forks once, so it is nobody's child
and outlives the rank that started it, points its stdio at /dev/null (its warnings go to
``agent.log`` in the job's folder, a file made only if there is something to say, so a
healthy job's folder holds its dumps alone), binds its socket and
answers one line on the pipe it got as stdout: ``{"pid"}``, ``{"elsewhere": true}`` when
another agent of this job already serves the host, or ``{"error"}``. It writes the host's
document and its head every interval, in one request (:class:`.server.HostAgent`), and
ends, after one last write, ``linger_s`` after its last rank left (or ``first_s`` after it
started if none came), or on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import sys
from typing import Any

from cclctl.errors import StoreError
from cclctl.host_status import HEAD_KEY, KEY, HostDocument
from cclctl.runtime.agent.dump_requests import DUMP_KEY
from cclctl.runtime.hostagent.address import socket_name
from cclctl.runtime.hostagent.rendezvous import serve_rendezvous
from cclctl.runtime.hostagent.revoke_fanout import serve_fanout
from cclctl.runtime.hostagent.server import HostAgent
from cclctl.store.backends import endpoint_of, open_store
from cclctl.store.detached import say, to_devnull
from cclctl.store.scope import ScopedStore
from cclctl.telemetry.exporter_host import HostCollector, serve_host_metrics
from cclctl.telemetry.http_serve import MetricsHTTPServer

log = logging.getLogger("cclctl.hostagent")

#: the most a spec line may hold
MAX_SPEC_BYTES = 4096
#: the store's answer to one write waits no longer than this
WRITE_TIMEOUT_S = 10.0


def read_spec(line: bytes) -> dict[str, Any]:
    """The starter's line: ``job``, ``store`` (host:port), ``token``, ``host``,
    ``interval_s``, ``linger_s``, ``first_s``; a ValueError says what is wrong with it."""
    spec = json.loads(line) if line.strip() else None
    if not isinstance(spec, dict):
        raise ValueError("expected one JSON object on stdin")
    for name in ("job", "store", "token", "host"):
        if not isinstance(spec.get(name), str):
            raise ValueError(f"{name} is missing or not a string")
    for name in ("interval_s", "linger_s", "first_s"):
        value = spec.get(name)
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} is missing or not a positive number")
    endpoint_of(spec["store"])  # a StoreError (a ValueError's kin) names a bad address
    return spec


async def serve(spec: dict[str, Any], answer: int) -> int:
    """Bind, answer the starter on ``answer``, then write the host's document until the
    agent's ranks are gone (or SIGTERM, or the store refuses every write)."""
    token = spec["token"] or None
    client = open_store(
        spec["store"], timeout_s=WRITE_TIMEOUT_S, connect_timeout_s=WRITE_TIMEOUT_S, token=token
    )
    store = ScopedStore.for_job(client, spec["job"])
    key, head = f"{KEY}{spec['host']}", f"{HEAD_KEY}{spec['host']}"

    async def write(doc: HostDocument) -> None:
        items = {key: doc.to_bytes(), head: doc.head_bytes()}
        await asyncio.to_thread(store.set_many, items)

    agent = HostAgent(spec["host"], write, float(spec["interval_s"]))
    try:
        name = socket_name(spec["job"], spec["host"], spec["store"], spec["token"])
        server = await agent.serve(name)
    except OSError as exc:
        client.close()
        if exc.errno == errno.EADDRINUSE:
            say(answer, {"elsewhere": True})
            return 0
        say(answer, {"error": f"the host agent cannot listen: {exc.strerror or exc}"})
        return 1
    try:
        close_rendezvous = await serve_rendezvous(spec, name, agent.hold)
    except Exception as exc:  # its ranks then join alone; statuses still go through it
        close_rendezvous = _nothing
        log.warning("cclctl host agent: no rendezvous service: %s", exc)
    exporter = _exporter(spec, agent)
    say(answer, {"pid": os.getpid()})
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    writing = asyncio.ensure_future(agent.run(stop))
    reading = asyncio.ensure_future(_read_news(store, agent, stop))
    revokes = asyncio.ensure_future(serve_fanout(spec, name, stop))
    idle = asyncio.ensure_future(agent.idle_for(float(spec["linger_s"]), float(spec["first_s"])))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({idle, stopped, writing}, return_when="FIRST_COMPLETED")
    server.close()
    stop.set()
    await writing
    await reading
    await revokes
    if exporter is not None:
        exporter.stop()
    idle.cancel()
    close_rendezvous()
    client.close()
    log.info("cclctl host agent of %s: %d writes, %d failed, exiting", spec["host"],
             agent.writes, agent.write_errors)  # fmt: skip
    return 0


async def _read_news(store: ScopedStore, agent: HostAgent, stop: asyncio.Event) -> None:
    """The job's dump requests, read once per interval for every rank of the host."""
    while not stop.is_set():
        try:
            count, why = await asyncio.to_thread(
                lambda: (store.try_get(f"{DUMP_KEY}/count"), store.try_get(f"{DUMP_KEY}/why"))
            )
            agent.news = {
                "dump_count": count.decode() if count else None,
                "dump_why": why.decode() if why else None,
            }
        except Exception as exc:  # the store's trouble: the ranks' own polls take over
            agent.news = {}
            log.warning("cclctl host agent: reading the job's requests failed: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), agent.interval_s)


def _nothing() -> None:
    pass


def _exporter(spec: dict[str, Any], agent: HostAgent) -> MetricsHTTPServer | None:
    """The host's Prometheus endpoint, where the spec asks for one (None if it cannot bind:
    the job runs on without it)."""
    if not spec.get("metrics_port"):
        return None
    collector = HostCollector(spec["job"], spec["host"], agent.decoded, agent.counts)
    try:
        return serve_host_metrics(
            collector, spec.get("metrics_addr") or "127.0.0.1", int(spec["metrics_port"])
        )
    except OSError as exc:
        log.warning("cclctl host agent: no metrics on port %s: %s", spec["metrics_port"],
                    exc.strerror or exc)  # fmt: skip
        return None


def main() -> int:
    answer = os.dup(1)  # the starter's pipe; stdio itself holds no pipe from here on
    to_devnull(1)
    try:
        spec = read_spec(sys.stdin.buffer.readline(MAX_SPEC_BYTES))
    except (ValueError, StoreError) as exc:
        say(answer, {"error": f"the host agent got a bad start line: {exc}"})
        return 2
    to_devnull(0)
    if os.fork() > 0:  # the starter reaps this one at once; the agent is orphaned, on purpose
        os._exit(0)
    os.setsid()
    _log_to(spec.get("log"))
    try:
        return asyncio.run(serve(spec, answer))
    except Exception:
        log.exception("cclctl host agent failed")
        return 1


def _log_to(path: object) -> None:
    """Warnings to ``path`` (0600), made at the first one; none without a path."""
    if not isinstance(path, str) or not path:
        logging.disable(logging.CRITICAL)
        return
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    os.umask(0o077)
    handler = logging.FileHandler(path, delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s pid %(process)d %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])


if __name__ == "__main__":
    sys.exit(main())
