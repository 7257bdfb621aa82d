"""What reading a large job costs once its data is in: ``diagnose hang --store`` and ``top``
(``--json``, and ``--once`` drawing every rank's row in a pipe) on N simulated ranks' host
documents, with nothing else running.

The documents are ``scale_sim.py``'s (the same status templates, each host's made by a real
:class:`~cclctl.runtime.hostagent.server.HostAgent`, digests included), written once into
the real store (a process of its own, with a token); then the real CLI runs ``--repeat``
times as a subprocess, and its wall time, CPU time (user + system, from ``wait4``), peak
RSS and verdict are printed. So the figures are the reader's, apart from the simulator's
feeding, which ``scale_sim.py`` measures with the store under load.

In the same run, in this process, the same listing is read both ways, alternated, the
cyclic GC paused as the CLI pauses it:
every status parsed (``alike_from=None``, what ``top`` does) and alike ranks made from one
model per key (what ``diagnose hang --store`` does from 1,024 statuses), each followed by
the diagnosis; their times and ratio are printed, and whether the two diagnoses are equal.
Asserts nothing.

    python benchmarks/scale_read.py --ranks 100000 [--repeat 3] [--no-top]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import secrets
import statistics
import sys
import time
from typing import Any

import scale_sim_docs as docs
from scale_sim import cli
from scale_sim_procs import end_store, store_main

from cclctl.commands.diagnose_sources import no_cycle_collection
from cclctl.diagnose_io.live import diagnose_live
from cclctl.live import snapshot
from cclctl.live.alike import ALIKE_FROM
from cclctl.runtime.hostagent.server import HostAgent
from cclctl.store.client import StoreClient

JOB = "scale-read"


def documents(n: int, per_host: int, planted: int) -> dict[str, bytes]:
    """The job's keys as its hosts' agents leave them (and the rendezvous' world size)."""
    now = docs.now_ns()
    templates = docs.hang_templates(JOB, n, now)

    async def nowhere(doc: bytes) -> None:
        return None

    out = {f"{snapshot.job_prefix(JOB)}rdzv/world_size": json.dumps({"world_size": n}).encode()}
    for h in range((n + per_host - 1) // per_host):
        name = docs.host_name(h)
        agent = HostAgent(name, nowhere, 1.0, pid=100_000 + h)
        for rank in range(h * per_host, min(n, (h + 1) * per_host)):
            text = templates["behind" if rank == planted else "waiting"]
            agent.receive(rank, (text % docs.values(rank, n, per_host, 1000, now)).encode())
        out[f"{snapshot.job_prefix(JOB)}host/{name}"] = agent.document().to_bytes()
    return out


def in_process(address: str, rounds: int) -> dict[str, Any]:
    """The job's keys listed from the store (seconds, median), then read both ways,
    alternated: seconds each (median), and their ratio; the diagnoses are taken at one
    clock, so they can be compared."""
    times: dict[str, list[float]] = {"list": [], "every": [], "alike": []}
    verdicts: dict[str, Any] = {}
    fetched_ns = time.time_ns()
    for _ in range(rounds):
        with StoreClient.from_address(address) as client:
            began = time.perf_counter()
            listing = client.list(snapshot.job_prefix(JOB))
            times["list"].append(time.perf_counter() - began)
        for side, alike_from in (("every", None), ("alike", ALIKE_FROM)):
            began = time.perf_counter()
            with no_cycle_collection():  # as the CLI reads
                statuses = snapshot.parse(JOB, "here", listing, alike_from=alike_from)
                statuses.fetched_ns = fetched_ns
                diagnosis = diagnose_live(statuses)
            times[side].append(time.perf_counter() - began)
            doc = diagnosis.to_dict()
            doc["time_ns"] = None
            verdicts[side] = doc["verdicts"]
    every, alike = statistics.median(times["every"]), statistics.median(times["alike"])
    return {"list_s": round(statistics.median(times["list"]), 2),
            "every_s": round(every, 2), "alike_s": round(alike, 2),
            "every_over_alike": round(every / alike, 2),
            "same_verdicts": verdicts["every"] == verdicts["alike"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=100_000)
    parser.add_argument("--per-host", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="CLI runs per command")
    parser.add_argument("--rounds", type=int, default=3, help="in-process rounds per side")
    parser.add_argument("--no-top", action="store_true")
    parser.add_argument("--cli-mem-gib", type=float, default=6.0)
    args = parser.parse_args()
    planted = args.ranks // 3 + 1
    token = secrets.token_hex(16)
    there, here = mp.Pipe()
    store = mp.Process(target=store_main, args=(token, here), daemon=True)
    store.start()
    port = there.recv()
    address = f"127.0.0.1:{port}"
    try:
        began = time.perf_counter()
        listing = documents(args.ranks, args.per_host, planted)
        with StoreClient.from_address(address, token=token) as client:
            for key, value in listing.items():
                client.set(key, value)
        print(f"# {args.ranks} ranks, planted rank {planted}: {len(listing)} keys, "
              f"{sum(map(len, listing.values())) / 2**20:.0f} MiB, written in "
              f"{time.perf_counter() - began:.1f} s; load {os.getloadavg()}")  # fmt: skip
        commands = [("diagnose hang", ["diagnose", "hang", "--json"])]
        if not args.no_top:
            commands.append(("top --json", ["top", "--json"]))
            commands.append(("top --once", ["top", "--once"]))  # every rank's row, in a pipe
        for name, words in commands:
            for i in range(args.repeat):
                run = cli([*words, "--store", address, "--job", JOB], 600, args.cli_mem_gib)
                named = (
                    f"rank {planted} " in run["stdout"] or f'"rank": {planted},' in run["stdout"]
                )
                cpu = run.get("cpu_s", float("nan"))
                print(f"{name:14} run {i + 1}: wall {run['wall_s']:.2f} s, cpu {cpu:.2f}"
                      f" s, peak RSS {run['max_rss_mib']:.0f} MiB, exit {run['rc']}, names "
                      f"the planted rank: {named}", flush=True)  # fmt: skip
        print("in process:", in_process(address, args.rounds), f"load {os.getloadavg()}")
    finally:
        end_store(there, store)


if __name__ == "__main__":
    sys.exit(main())
