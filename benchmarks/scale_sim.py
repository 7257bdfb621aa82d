"""Issue #40's scale simulator: N simulated ranks on N/8 hosts against the real store.

The store is the real :class:`cclctl.store.server.StoreServer` (with a token), in a process
of its own. ``--procs`` worker processes each run their share of the hosts' real
:class:`cclctl.runtime.hostagent.server.HostAgent` objects in one asyncio loop: every
interval a worker hands each agent its ranks' statuses (``HostAgent.receive``, the call the
agent's socket server makes; the simulated ranks have no process and no socket of their
own to the agent), and each agent writes its host's document and its head, in one
request, on its own timer through the worker's one TCP connection to the store
(:mod:`scale_sim_client`, pipelined). The statuses are built from templates
(:mod:`scale_sim_docs`), so set-up is linear in N.

With a hang planted (``--plant hang``: one rank never enters the world communicator's
seq the others wait in) it measures, while the agents keep writing: the store's writes
per interval (counted by the writers) against hosts and ranks, the store's CPU per
interval and RSS (``/proc`` of its pid), and the wall time, verdict and peak RSS of the
real CLI as a subprocess: ``cclctl diagnose hang --store``, ``cclctl top --json``. With a
slow rank planted (``--plant slow``: it enters every call late, in its slowness signals),
``cclctl diagnose slow --store``. Prints figures (``--json``: one document); asserts
nothing.

    python benchmarks/scale_sim.py --ranks 10000 --per-host 8 --procs 2 [--plant slow]

With ``--rendezvous`` it measures the fan-in rendezvous through the agents, and the
transport's agreement after it, instead (:mod:`scale_sim_rdzv`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import scale_sim_docs as docs
from scale_sim_client import AsyncStore
from scale_sim_procs import end_store, end_workers, proc_cpu_s, proc_rss_mib, store_main

from cclctl.host_status import HEAD_KEY, KEY, HostDocument
from cclctl.runtime.hostagent.server import HostAgent
from cclctl.store.scope import job_prefix

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- a worker's process
def worker_main(spec: dict[str, Any], queue: Any) -> None:
    asyncio.run(_worker(spec, queue))


async def _worker(spec: dict[str, Any], queue: Any) -> None:
    n, per_host, interval = spec["ranks"], spec["per_host"], spec["interval"]
    job, t0 = spec["job"], spec["t0_ns"]
    store = await AsyncStore().connect("127.0.0.1", spec["port"], spec["token"])
    if spec["plant"] == "hang":
        tmpl = docs.hang_templates(job, n, t0)

        def template(rank: int) -> str:
            return tmpl["behind" if rank == spec["planted"] else "waiting"]
    else:
        tmpl = docs.slow_templates(job, n, t0, per_host)

        def template(rank: int) -> str:
            if rank == spec["planted"]:
                return tmpl["slow"]
            if rank == (spec["planted"] + 1) % n:
                return tmpl["after"]
            return tmpl[f"normal{rank % per_host}"]

    prefix = job_prefix(job)
    agents: list[tuple[HostAgent, range]] = []
    for h in range(spec["first_host"], spec["last_host"]):
        name = docs.host_name(h)

        async def write(doc: HostDocument, name: str = name) -> None:
            whole, head = prefix + KEY + name, prefix + HEAD_KEY + name
            await store.set_many({whole: doc.to_bytes(), head: doc.head_bytes()})

        ranks = range(h * per_host, min(n, (h + 1) * per_host))
        agents.append((HostAgent(name, write, interval, pid=100_000 + h), ranks))
    templates = {rank: template(rank) for _, ranks in agents for rank in ranks}
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    running: list[asyncio.Task[None]] = []
    rounds = 0
    while not stop.is_set():
        began = time.monotonic()
        now = time.time_ns()
        for i, (agent, ranks) in enumerate(agents):
            for rank in ranks:
                agent.receive(
                    rank, (templates[rank] % docs.values(rank, n, per_host, 1000, now)).encode()
                )
            if i % 64 == 63:
                await asyncio.sleep(0)  # the agents' writes go on meanwhile
        feed_s = time.monotonic() - began
        if not running:
            running = [asyncio.ensure_future(agent.run(stop)) for agent, _ in agents]
        rounds += 1
        writes = sum(agent.writes for agent, _ in agents)
        errors = sum(agent.write_errors for agent, _ in agents)
        queue.put((spec["index"], rounds, writes, errors, store.sent_bytes, feed_s))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, interval - (time.monotonic() - began)))
    await asyncio.gather(*running)
    await store.close()


# ---------------------------------------------------------------- the CLI, measured
def cli(args: list[str], timeout_s: float, mem_gib: float) -> dict[str, Any]:
    """Run ``python -m cclctl ARGS``: wall time, exit code, CPU time and peak RSS (its own
    rusage, from wait4) and its output. Its address space is capped at ``mem_gib`` (a
    reader that grows without bound on a shared machine fails with MemoryError instead of
    taking it down)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    env.pop("CCLCTL_TOKEN", None)  # readers need no token: the statuses are public
    limit = int(mem_gib * 2**30)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        began = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "cclctl", *args],
            stdout=out,
            stderr=err,
            env=env,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
        )
        killer = threading.Timer(timeout_s, os.kill, (proc.pid, signal.SIGKILL))
        killer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - began
        killer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rc": proc.returncode,
                "max_rss_mib": usage.ru_maxrss / 1024, "stdout": out.read().decode(),
                "stderr": err.read().decode()[-2000:]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--per-host", type=int, default=8)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--interval", type=float, default=1.0, help="status interval (s)")
    parser.add_argument("--measure", type=int, default=5, help="intervals to measure")
    parser.add_argument("--plant", choices=("hang", "slow"), default="hang")
    parser.add_argument("--cli-timeout", type=float, default=300.0)
    parser.add_argument("--cli-mem-gib", type=float, default=6.0, help="a CLI run's memory cap")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--rendezvous",
        action="store_true",
        help="the fan-in rendezvous and the transport's agreement (scale_sim_rdzv.py)",
    )
    parser.add_argument(
        "--revoke",
        choices=("agent", "direct"),
        default=None,
        help="time a revoke record to every rank instead (scale_sim_revoke.py)",
    )
    args = parser.parse_args()
    if args.rendezvous:
        import scale_sim_rdzv

        figures = scale_sim_rdzv.measure(args)
        print(json.dumps(figures, indent=1))
        return
    if args.revoke:
        revoke_main(args)
        return
    n, per_host = args.ranks, args.per_host
    hosts = -(-n // per_host)
    planted = n // 3 + 1
    job = f"sim{args.plant}"
    token = secrets.token_hex(16)
    ctx = mp.get_context("fork")
    figures: dict[str, Any] = {
        "ranks": n, "hosts": hosts, "per_host": per_host, "procs": args.procs,
        "interval_s": args.interval, "plant": args.plant, "planted_rank": planted,
        "cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg(),
    }  # fmt: skip
    parent, child = ctx.Pipe()
    store = ctx.Process(target=store_main, args=(token, child), daemon=True)
    store.start()
    port = parent.recv()
    address = f"127.0.0.1:{port}"
    queue = ctx.Queue()
    workers = []
    share = -(-hosts // args.procs)
    t0 = time.time_ns()
    for index in range(args.procs):
        spec = {
            "index": index, "ranks": n, "per_host": per_host, "interval": args.interval,
            "job": job, "t0_ns": t0, "port": port, "token": token, "plant": args.plant,
            "planted": planted, "first_host": index * share,
            "last_host": min(hosts, (index + 1) * share),
        }  # fmt: skip
        proc = ctx.Process(target=worker_main, args=(spec, queue), daemon=True)
        proc.start()
        workers.append(proc)
    last: dict[int, tuple[int, int, int, int, float]] = {}
    feeds: list[float] = []

    def drain(until_rounds: int) -> None:
        while (
            min((v[0] for v in last.values()), default=0) < until_rounds or len(last) < args.procs
        ):
            index, rounds, writes, errors, sent, feed_s = queue.get(timeout=600)
            last[index] = (rounds, writes, errors, sent, feed_s)
            feeds.append(feed_s)

    try:
        began = time.perf_counter()
        drain(3)  # two intervals of writes: every host has written
        figures["start_s"] = time.perf_counter() - began
        writes0 = sum(v[1] for v in last.values())
        sent0 = sum(v[3] for v in last.values())
        cpu0, wall0 = proc_cpu_s(store.pid), time.perf_counter()
        rounds0 = min(v[0] for v in last.values())
        feeds.clear()
        drain(rounds0 + args.measure)
        elapsed = time.perf_counter() - wall0
        cpu = proc_cpu_s(store.pid) - cpu0
        writes = sum(v[1] for v in last.values()) - writes0
        intervals = elapsed / args.interval
        figures.update(
            measured_s=elapsed,
            writes_per_interval=writes / intervals,
            writes_per_interval_per_host=writes / intervals / hosts,
            writes_per_interval_per_rank=writes / intervals / n,
            write_errors=sum(v[2] for v in last.values()),
            mib_per_interval=(sum(v[3] for v in last.values()) - sent0) / intervals / 2**20,
            store_cpu_s_per_interval=cpu / intervals,
            store_cpu_share=cpu / elapsed,
            feed_s_per_interval_max=max(feeds) if feeds else 0.0,
            store_rss_mib=proc_rss_mib(store.pid),
        )
        base = ["--store", address, "--job", job]
        if args.plant == "hang":
            hang = cli(["diagnose", "hang", *base, "--json"], args.cli_timeout, args.cli_mem_gib)
            figures["diagnose_hang"] = _verdict(hang, planted)
            top = cli(["top", *base, "--json"], args.cli_timeout, args.cli_mem_gib)
            figures["top"] = _brief(top, planted)
        else:
            slow = cli(["diagnose", "slow", *base, "--json"], args.cli_timeout, args.cli_mem_gib)
            figures["diagnose_slow"] = _verdict(slow, planted)
        figures["store_rss_mib_after"] = proc_rss_mib(store.pid)
    finally:
        end_workers(workers, terminate=True)
        end_store(parent, store)
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    for key, value in figures.items():
        print(f"{key:32} {value}")


def revoke_main(args: argparse.Namespace) -> None:
    """``--revoke agent|direct``: the store's waits on a revoke record and the time from the
    record to every simulated rank (through the hosts' agents, or each rank's own wait)."""
    import scale_sim_revoke

    token = secrets.token_hex(16)
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    store = ctx.Process(target=store_main, args=(token, child), daemon=True)
    store.start()
    load = os.getloadavg()
    try:
        figures = scale_sim_revoke.run(ctx, parent.recv(), token, args)
    finally:
        end_store(parent, store)
    figures.update(per_host=args.per_host, procs=args.procs, load_avg_at_start=load)
    for key, value in figures.items():
        print(f"{key:32} {value}")


def _verdict(run: dict[str, Any], planted: int) -> dict[str, Any]:
    """A diagnosis' time, exit code, peak RSS, first verdict and whether it names the rank."""
    out = _brief(run, planted)
    try:
        doc = json.loads(run["stdout"])
    except ValueError:
        return out
    verdicts = doc.get("verdicts") or doc.get("findings") or []
    if verdicts:
        first = verdicts[0]
        out["verdict"] = str(first.get("summary") or first.get("text") or first)[:300]
        out["names_planted"] = f"rank {planted}" in json.dumps(first) or planted in (
            first.get("ranks") or first.get("suspects") or []
        )
    return out


def _brief(run: dict[str, Any], planted: int) -> dict[str, Any]:
    return {
        "wall_s": round(run["wall_s"], 3),
        "cpu_s": round(run["cpu_s"], 3),  # its own user + system time: what load does not add
        "rc": run["rc"],
        "max_rss_mib": round(run["max_rss_mib"], 1),
        "stdout_bytes": len(run["stdout"]),
        "mentions_planted": f"rank {planted}" in run["stdout"]
        or f'"rank": {planted}' in run["stdout"]
        or f'"rank":{planted}' in run["stdout"],
        "stderr_tail": run["stderr"][-300:],
    }


if __name__ == "__main__":
    main()
