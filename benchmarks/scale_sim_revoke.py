"""The revoke record at scale, for ``scale_sim.py --revoke``: how many waits the store holds
and how long a record takes to reach every simulated rank.

``agent``: each simulated host runs the real
:class:`cclctl.runtime.hostagent.revoke_fanout.RevokeFanout` on a real abstract socket,
its one blocking wait on a store connection of its own (reads on the worker's shared one),
and each simulated rank is an asyncio connection to it that asks as a rank's
:class:`~cclctl.runtime.hostagent.revoke_feed.RevokeFeed` does. ``direct``: each simulated
rank holds its own blocking wait on a store connection of its own, as every rank did
before the fan-out. The parent writes the record once every wait is in place and takes
the time until the last rank has it (``time.time_ns`` across processes of one machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from multiprocessing.connection import Connection
from typing import Any

from scale_sim_client import AsyncStore
from scale_sim_procs import end_workers

from cclctl import revocation
from cclctl.revocation import Revocation
from cclctl.runtime.hostagent.revoke_fanout import ANSWER, ASK, RevokeFanout, fanout_name
from cclctl.store.client import StoreClient
from cclctl.store.protocol import Op, Status, pack_request
from cclctl.store.scope import job_prefix

WAIT_S = 600.0  # one wait in the store (the simulation ends it by closing)


class WaitingStore(AsyncStore):
    """The pipelined client with a blocking ``wait`` (a connection that waits holds up
    the requests behind it: the store answers a connection's requests in order)."""

    async def wait_for(self, key: str, timeout_s: float, op: Op = Op.WAIT) -> bytes | None:
        """``op`` WAIT: b"" once the key exists; GET: its value; None at the timeout."""
        assert self._writer is not None, "connect() first"
        future: asyncio.Future[tuple[int, list[bytes]]] = asyncio.get_running_loop().create_future()
        self._pending.append(future)
        self._writer.write(pack_request(op, [key.encode()], timeout_s))
        self.requests += 1
        await self._writer.drain()
        status, fields = await future
        if status != Status.OK:
            return None
        return fields[0] if fields else b""

    async def try_get(self, key: str) -> bytes | None:
        status, fields = await self.request(Op.TRY_GET, [key.encode()])
        return fields[0] if status == Status.OK else None


async def _rank_via_agent(name: str, got: list[int]) -> None:
    reader, writer = await asyncio.open_unix_connection(name)
    try:
        while True:
            writer.write(ASK.pack(0))
            (length,) = ANSWER.unpack(await reader.readexactly(ANSWER.size))
            if length:
                await reader.readexactly(length)
                got.append(time.time_ns())
                return
    finally:
        writer.close()


async def _rank_direct(spec: dict[str, Any], key: str, got: list[int]) -> None:
    store = await WaitingStore(max_pending=4).connect("127.0.0.1", spec["port"], spec["token"])
    try:
        if await store.wait_for(key, WAIT_S) is not None:
            got.append(time.time_ns())
    finally:
        await store.close()


async def _worker(spec: dict[str, Any], pipe: Connection) -> None:
    key = job_prefix(spec["job"]) + revocation.KEY
    port, token = spec["port"], spec["token"]
    got: list[int] = []
    ranks: list[asyncio.Task[None]] = []
    fanouts: list[RevokeFanout] = []
    watching: list[asyncio.Task[None]] = []
    stores: list[WaitingStore] = []
    stop = asyncio.Event()
    reads = await WaitingStore().connect("127.0.0.1", port, token)
    for h in range(spec["first_host"], spec["last_host"]):
        first, last = h * spec["per_host"], min(spec["ranks"], (h + 1) * spec["per_host"])
        if spec["mode"] == "direct":
            ranks += [
                asyncio.ensure_future(_rank_direct(spec, key, got)) for _ in range(first, last)
            ]
            continue
        waits = await WaitingStore(max_pending=4).connect("127.0.0.1", port, token)
        stores.append(waits)

        async def wait(timeout_s: float, waits: WaitingStore = waits) -> bytes | None:
            return await waits.wait_for(key, timeout_s, Op.GET)

        async def read() -> bytes | None:
            return await reads.try_get(key)

        fanout = RevokeFanout(wait, read, poll_s=spec["interval"] / 2)
        name = fanout_name(f"\0cclctl-sim-{spec['run']}-{h}")
        await fanout.serve(name)
        fanouts.append(fanout)
        watching.append(asyncio.ensure_future(fanout.run(stop)))
        ranks += [asyncio.ensure_future(_rank_via_agent(name, got)) for _ in range(first, last)]
    while spec["mode"] == "agent" and sum(f.subscribers for f in fanouts) < len(ranks):
        await asyncio.sleep(0.05)  # every rank asked its host's fan-out
    await asyncio.sleep(0.5)  # every wait reached the store
    pipe.send(("ready", len(ranks), sum(f.waits for f in fanouts)))
    await asyncio.gather(*ranks, return_exceptions=True)
    pipe.send(("got", len(got), min(got, default=0), max(got, default=0), sorted(got)))
    stop.set()
    for fanout in fanouts:
        fanout.close()
    for store in (*stores, reads):
        await store.close()
    rest = asyncio.all_tasks() - {asyncio.current_task()}  # the fan-outs' connections
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


def worker_main(spec: dict[str, Any], pipe: Connection) -> None:
    asyncio.run(_worker(spec, pipe))


def run(ctx: Any, port: int, token: str, args: Any) -> dict[str, Any]:
    """Place every simulated rank's wait (``args.revoke``: through the agents, or each its
    own), write one record, and time it to the last rank; the figures."""
    n, per_host = args.ranks, args.per_host
    hosts = -(-n // per_host)
    share = -(-hosts // args.procs)
    pipes, workers = [], []
    run_id = secrets.token_hex(4)
    for index in range(args.procs):
        spec = {
            "ranks": n, "per_host": per_host, "interval": args.interval, "job": "simrevoke",
            "port": port, "token": token, "mode": args.revoke, "run": run_id,
            "first_host": index * share, "last_host": min(hosts, (index + 1) * share),
        }  # fmt: skip
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker_main, args=(spec, child), daemon=True)
        proc.start()
        pipes.append(parent)
        workers.append(proc)
    figures: dict[str, Any] = {"mode": args.revoke, "ranks": n, "hosts": hosts}
    try:
        began = time.perf_counter()
        ready = [pipe.recv() for pipe in pipes]
        figures["set_up_s"] = time.perf_counter() - began
        figures["store_waits"] = (
            sum(r[2] for r in ready) if args.revoke == "agent" else sum(r[1] for r in ready)
        )
        figures["store_waits_per_host"] = figures["store_waits"] / hosts
        record = Revocation("aborted", revocation.OPERATOR, "scale test", via="operator")
        with StoreClient.from_address(f"127.0.0.1:{port}", token=token) as client:
            t0 = time.time_ns()
            client.compare_set(f"{job_prefix('simrevoke')}{revocation.KEY}", None, record.encode())
        done = [pipe.recv() for pipe in pipes]
        times = sorted(t for d in done for t in d[4])
        figures["notified"] = len(times)
        if times:
            figures["to_first_rank_ms"] = (times[0] - t0) / 1e6
            figures["to_half_ms"] = (times[len(times) // 2] - t0) / 1e6
            figures["to_every_rank_ms"] = (times[-1] - t0) / 1e6
    finally:
        end_workers(workers)
    return figures


if __name__ == "__main__":  # pragma: no cover - run through scale_sim.py --revoke
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit("run it as: python benchmarks/scale_sim.py --revoke agent")
