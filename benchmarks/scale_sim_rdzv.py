"""``scale_sim.py --rendezvous``: the fan-in rendezvous of N simulated ranks on N/8 hosts,
through real host agents' rendezvous services, against the real store.

Each worker process runs its share of the hosts' real
:class:`cclctl.runtime.hostagent.rendezvous.RendezvousService` objects on one asyncio loop.
A simulated rank has no process and no socket: its claim enters through
``RendezvousService.claim``, the call the agent's socket handler makes for a rank's frame.
Everything after that is the agents' real code (:mod:`cclctl.runtime.hostagent.fanin`):
each agent checks its token against rank 0's proof, writes its host's group, counts its
ranks in, reads the world document. As a real agent, each has two connections to the
store: its quick requests go through the worker's one pipelined connection
(:mod:`scale_sim_client`), its blocking reads through a connection of its own (the store
answers a connection's requests in order, so a blocking read holds it).

Then each simulated rank meets for its transport through its agent: the three frames a
rank's :class:`cclctl.runtime.job.fanin_meeting.FanInMeeting` sends (its address, its
segment name, whether it mapped), handed to the agent's real
:class:`cclctl.runtime.hostagent.meeting_service.MeetingService` as the socket handler
hands them. Everything the store sees is the agents' real requests: one document of its
ranks' addresses, the marker, one add and one blocking read of the verdict per host (the
host whose add reaches N lists the problems and writes the verdict). (The dials' address
reads come later, one per peer host an algorithm links to.)

The agents and the ranks connect first; then every simulated rank claims at once. The
figures: the wall time from then until every rank of every host has its answer (the world
document), until every host has added to the counter, and until every rank has its
transport's verdict. Also: store requests per host (the agents' requests, counted by their
store adapter: the rendezvous', then the transport agreement's), the world document's
size, the store's CPU and RSS, the simulator's workers' CPU. Prints figures; asserts nothing.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import secrets
import time
from typing import Any

import scale_sim_docs as docs
from scale_sim_client import AsyncStore
from scale_sim_procs import end_store, end_workers, proc_cpu_s, proc_rss_mib, store_main

from cclctl.ranges import fold_ranks
from cclctl.runtime.hostagent.fanin import WORLD_KEY, Where
from cclctl.runtime.hostagent.rendezvous import RendezvousService
from cclctl.runtime.job.token import publish_check
from cclctl.store.client import StoreClient
from cclctl.store.protocol import Op, Status
from cclctl.store.scope import ScopedStore, job_prefix

TIMEOUT_S = 300.0
KEY = "sim-boot-id:42:4026531836"  # every simulated host's ranks share one host key


class SimFanInStore:
    """:class:`cclctl.runtime.hostagent.fanin.FanInStore` over the simulator's asyncio
    clients: ``quick`` (shared, pipelined) and ``waiting`` (this agent's own); counts
    requests."""

    def __init__(self, quick: AsyncStore, waiting: AsyncStore, prefix: str) -> None:
        self.quick, self.waiting, self.prefix = quick, waiting, prefix
        self.requests = 0
        self.added = 0.0  # when its last add was answered (the loop's clock)

    async def _ask(
        self, via: AsyncStore, op: Op, fields: list[bytes], timeout_s: float | None = None
    ) -> tuple[int, list[bytes]]:
        self.requests += 1
        status, out = await via.request(op, fields, timeout_s)
        if status == Status.ERROR:
            raise ConnectionError(out[0].decode(errors="replace") if out else "store error")
        return status, out

    async def set(self, key: str, value: bytes) -> None:
        await self._ask(self.quick, Op.SET, [(self.prefix + key).encode(), value])

    async def add(self, key: str, delta: int) -> int:
        _, out = await self._ask(self.quick, Op.ADD, [(self.prefix + key).encode(), b"%d" % delta])
        self.added = time.monotonic()
        return int(out[0])

    async def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        fields = [(self.prefix + key).encode(), desired] + ([expected] if expected else [])
        status, out = await self._ask(self.quick, Op.COMPARE_SET, fields)
        return out[0] if status == Status.OK else b""

    async def get(self, key: str, timeout_s: float) -> bytes | None:
        status, out = await self._ask(
            self.waiting, Op.GET, [(self.prefix + key).encode()], max(0.0, timeout_s)
        )
        return out[0] if status == Status.OK else None

    async def list(self, prefix: str) -> dict[str, bytes]:
        _, out = await self._ask(self.quick, Op.LIST, [(self.prefix + prefix).encode()])
        cut = len(self.prefix)
        return {out[i].decode()[cut:]: out[i + 1] for i in range(0, len(out), 2)}


async def meet(service: RendezvousService, rank: int, local: range, n: int) -> bool:
    """One simulated rank's transport meeting through its agent: the frames a rank's
    :class:`cclctl.runtime.job.fanin_meeting.FanInMeeting` sends, handed to the agent's
    real :class:`~cclctl.runtime.hostagent.meeting_service.MeetingService` as its socket
    handler hands them; whether the agent answered every step (no rank sent to the store)."""
    # the rank's key is its world document's (its host's name: one key per host here)
    base = {"rank": rank, "key": service.host, "local": fold_ranks(local), "world_size": n,
            "timeout_s": TIMEOUT_S}  # fmt: skip
    addr = await service.meeting.handle({**base, "meet": "addr", "value": f"127.0.0.1:{rank}"})
    names = await service.meeting.handle({**base, "meet": "segments", "value": f"sim-r{rank}"})
    mapped = await service.meeting.handle({**base, "meet": "mapped", "value": ""})
    verdict = mapped.get("verdict")
    return ("ok" in addr and "names" in names and isinstance(verdict, dict)
            and "error" not in verdict)  # fmt: skip


def worker_main(spec: dict[str, Any], ready: Any, go: Any, results: Any) -> None:
    asyncio.run(_worker(spec, ready, go, results))


async def _worker(spec: dict[str, Any], ready: Any, go: Any, results: Any) -> None:
    n, per_host, job, token = spec["ranks"], spec["per_host"], spec["job"], spec["token"]
    port, prefix = spec["port"], job_prefix(job)
    where = Where(job, f"127.0.0.1:{port}")
    quick = await AsyncStore(max_pending=4096).connect("127.0.0.1", port, token)
    hosts = range(spec["first_host"], spec["last_host"])
    waiting = [await AsyncStore().connect("127.0.0.1", port, token) for _ in hosts]
    stores = [SimFanInStore(quick, wait, prefix) for wait in waiting]
    services = []
    for h, store in zip(hosts, stores, strict=True):

        async def check(timeout_s: float, store: SimFanInStore = store) -> bool:
            from cclctl import auth

            raw = await store.get(auth.TOKEN_CHECK_KEY, timeout_s)
            return raw is not None and auth.proves_check(raw, token, job)

        services.append(RendezvousService(docs.host_name(h), store, where, check))
    ready.put(spec["index"])
    await asyncio.to_thread(go.wait)
    began = time.monotonic()

    async def host(
        h: int, service: RendezvousService, store: SimFanInStore
    ) -> tuple[float, float, int, int]:
        local = range(h * per_host, min(n, (h + 1) * per_host))
        claims = [service.claim({"rank": r, "pid": 100_000 + r, "world_size": n,
                                 "local_world_size": len(local), "timeout_s": TIMEOUT_S,
                                 "key": KEY, "tcp": False})
                  for r in local]  # fmt: skip
        answers = await asyncio.gather(*claims)
        answered = time.monotonic()
        errors = sum(1 for a in answers if "error" in a)
        rendezvous_requests = store.requests
        if errors:
            return answered, answered, errors, 0
        met = await asyncio.gather(*(meet(service, r, local, n) for r in local))
        meeting = store.requests - rendezvous_requests
        return answered, time.monotonic(), sum(1 for ok in met if not ok), meeting

    done = await asyncio.gather(
        *(host(h, s, st) for h, s, st in zip(hosts, services, stores, strict=True))
    )
    meeting = [m for _, _, _, m in done]
    results.put({"index": spec["index"], "began": began, "last": max(t for t, _, _, _ in done),
                 "first": min(t for t, _, _, _ in done), "met": max(t for _, t, _, _ in done),
                 "errors": sum(e for _, _, e, _ in done),
                 "requests": [s.requests - m for s, m in zip(stores, meeting, strict=True)],
                 "meeting": meeting, "counted": max(s.added for s in stores),
                 "groups": sum(s.groups for s in services)})  # fmt: skip
    for store in (quick, *waiting):
        await store.close()


def measure(args: Any) -> dict[str, Any]:
    """Run the rendezvous once (``args``: ranks, per_host, procs); its figures."""
    n, per_host = args.ranks, args.per_host
    hosts = -(-n // per_host)
    job, token = "simrdzv", secrets.token_hex(16)
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    store = ctx.Process(target=store_main, args=(token, child), daemon=True)
    store.start()
    port = parent.recv()
    figures: dict[str, Any] = {"ranks": n, "hosts": hosts, "per_host": per_host,
                               "procs": args.procs, "cpus": os.cpu_count(),
                               "load_avg_at_start": os.getloadavg()}  # fmt: skip
    with StoreClient("127.0.0.1", port, token=token) as client:
        publish_check(ScopedStore.for_job(client, job), token, job)  # rank 0's, before it claims
        ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        share = -(-hosts // args.procs)
        workers = []
        for index in range(args.procs):
            spec = {"index": index, "ranks": n, "per_host": per_host, "job": job,
                    "token": token, "port": port, "first_host": index * share,
                    "last_host": min(hosts, (index + 1) * share)}  # fmt: skip
            proc = ctx.Process(target=worker_main, args=(spec, ready, go, results), daemon=True)
            proc.start()
            workers.append(proc)
        try:
            for _ in workers:
                ready.get(timeout=600)
            cpu0 = proc_cpu_s(store.pid)
            workers0 = sum(proc_cpu_s(w.pid) for w in workers)
            go.set()
            got = [results.get(timeout=TIMEOUT_S + 60) for _ in workers]
            workers_cpu = sum(proc_cpu_s(w.pid) for w in workers) - workers0
            began = min(r["began"] for r in got)
            requests = [count for r in got for count in r["requests"]]
            meets = [count for r in got for count in r["meeting"]]
            figures.update(
                rendezvous_s=round(max(r["last"] for r in got) - began, 3),
                first_host_answered_s=round(min(r["first"] for r in got) - began, 3),
                errors=sum(r["errors"] for r in got),
                groups=sum(r["groups"] for r in got),
                store_requests_per_host_mean=round(sum(requests) / len(requests), 2),
                store_requests_per_host_max=max(requests),
                transport_agreed_s=round(max(r["met"] for r in got) - began, 3),
                transport_all_counted_s=round(max(r["counted"] for r in got) - began, 3),
                transport_requests_per_host_mean=round(sum(meets) / len(meets), 2),
                transport_requests_per_host_max=max(meets),
                transport_requests_per_rank_max=0,  # a rank's steps go to its agent
                store_cpu_s=round(proc_cpu_s(store.pid) - cpu0, 3),
                simulator_cpu_s=round(workers_cpu, 3),
                store_rss_mib=round(proc_rss_mib(store.pid), 1),
                world_doc_bytes=len(client.get(job_prefix(job) + WORLD_KEY, timeout_s=5)),
            )
        finally:
            end_workers(workers)
            end_store(parent, store)
    return figures
