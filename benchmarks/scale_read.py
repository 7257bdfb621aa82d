"""What reading a large job costs once its data is in: ``diagnose hang --store`` and ``top``
(``--json``, and ``--once`` drawing every rank's row in a pipe) on N simulated ranks' host
documents, with nothing else running.

The documents are ``scale_sim.py``'s (the same status templates, each host's made by a real
:class:`~cclctl.runtime.hostagent.server.HostAgent`, digests included), written once into
the real store (a process of its own, with a token); then the real CLI runs ``--repeat``
times as a subprocess, and its wall time, CPU time (user + system, from ``wait4``), peak
RSS and verdict are printed. So the figures are the reader's, apart from the simulator's
feeding, which ``scale_sim.py`` measures with the store under load.

The job is written twice: as its agents write it (each host's document and its head) and,
as a control, under a second job name without the heads (as agents before them wrote it,
which a reader lists whole). ``diagnose hang`` runs on both.

In the same run, in this process, the job is read three ways, alternated, the cyclic GC
paused as the CLI pauses it, each followed by the diagnosis: the whole listing with every
status parsed (``alike_from=None``, what ``top`` does), the whole listing with alike ranks
made from one model per key, and through the heads (what ``diagnose hang --store`` does
from 1,024 statuses: the heads listed, a few documents read whole). Each side's seconds
(median, store requests included) and the ratios are printed, and whether the three
diagnoses are equal. Asserts nothing.

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
from cclctl.host_status import HEAD_KEY, KEY, HostDocument
from cclctl.live import snapshot
from cclctl.live.alike import ALIKE_FROM
from cclctl.runtime.hostagent.server import HostAgent
from cclctl.store.client import StoreClient

JOB = "scale-read"
#: the same job written without heads: a reader lists it whole
NO_HEADS = "scale-read-no-heads"


def documents(n: int, per_host: int, planted: int, job: str, heads: bool) -> dict[str, bytes]:
    """The job's keys as its hosts' agents leave them (and the rendezvous' world size);
    without ``heads``, as agents that wrote none left them."""
    now = docs.now_ns()
    templates = docs.hang_templates(job, n, now)

    async def nowhere(doc: HostDocument) -> None:
        return None

    prefix = snapshot.job_prefix(job)
    out = {f"{prefix}rdzv/world_size": json.dumps({"world_size": n}).encode()}
    for h in range((n + per_host - 1) // per_host):
        name = docs.host_name(h)
        agent = HostAgent(name, nowhere, 1.0, pid=100_000 + h)
        for rank in range(h * per_host, min(n, (h + 1) * per_host)):
            text = templates["behind" if rank == planted else "waiting"]
            agent.receive(rank, (text % docs.values(rank, n, per_host, 1000, now)).encode())
        doc = agent.document()
        out[f"{prefix}{KEY}{name}"] = doc.to_bytes()
        if heads:
            out[f"{prefix}{HEAD_KEY}{name}"] = doc.head_bytes()
    return out


def in_process(address: str, rounds: int) -> dict[str, Any]:
    """The job read three ways, alternated (see the module's docstring): seconds each
    (median), the ratios, and whether the diagnoses are equal (taken at one clock)."""
    sides = ("every", "alike", "heads")
    times: dict[str, list[float]] = {side: [] for side in sides}
    verdicts: dict[str, Any] = {}
    fetched_ns = time.time_ns()
    for _ in range(rounds):
        for side in sides:
            with StoreClient.from_address(address) as client:
                began = time.perf_counter()
                with no_cycle_collection():  # as the CLI reads
                    if side == "heads":
                        statuses = snapshot.fetch(client, JOB, alike_from=ALIKE_FROM)
                    else:
                        listing = client.list(snapshot.job_prefix(JOB))
                        alike_from = ALIKE_FROM if side == "alike" else None
                        statuses = snapshot.parse(JOB, "here", listing, alike_from=alike_from)
                    statuses.fetched_ns = fetched_ns
                    diagnosis = diagnose_live(statuses)
                times[side].append(time.perf_counter() - began)
            doc = diagnosis.to_dict()
            doc["time_ns"] = None
            verdicts[side] = doc["verdicts"]
    med = {side: statistics.median(times[side]) for side in sides}
    return {**{f"{side}_s": round(med[side], 2) for side in sides},
            "alike_over_heads": round(med["alike"] / med["heads"], 2),
            "every_over_heads": round(med["every"] / med["heads"], 2),
            "same_verdicts": verdicts["every"] == verdicts["alike"] == verdicts["heads"]}


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
        for job, heads in ((JOB, True), (NO_HEADS, False)):
            listing = documents(args.ranks, args.per_host, planted, job, heads)
            with StoreClient.from_address(address, token=token) as client:
                for key, value in listing.items():
                    client.set(key, value)
            print(f"# {job}: {args.ranks} ranks, planted rank {planted}: {len(listing)} keys, "
                  f"{sum(map(len, listing.values())) / 2**20:.0f} MiB, written in "
                  f"{time.perf_counter() - began:.1f} s; load {os.getloadavg()}")  # fmt: skip
        hang = ["diagnose", "hang", "--json"]
        commands = [("diagnose hang", hang, JOB), ("... no heads", hang, NO_HEADS)]
        if not args.no_top:
            commands.append(("top --json", ["top", "--json"], JOB))
            commands.append(("top --once", ["top", "--once"], JOB))  # every row, in a pipe
        for name, words, job in commands:
            for i in range(args.repeat):
                run = cli([*words, "--store", address, "--job", job], 600, args.cli_mem_gib)
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
