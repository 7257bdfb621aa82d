"""The scale simulator's processes: the real store in a process of its own, worker processes
ended by their pids, and what ``/proc`` says of a process's CPU time and memory."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from cclctl.store.server import StoreServer

CLK = os.sysconf("SC_CLK_TCK")


def store_main(token: str | None, pipe: Connection) -> None:
    """The store's process (``token``: the job's; None: none asked): it sends its port,
    then serves until the pipe says so (or its other end closes)."""
    server = StoreServer("127.0.0.1", 0, token=token).start()
    pipe.send(server.port)
    pipe.recv()


def end_store(pipe: Connection, store: Any) -> None:
    """Tell the store's process to end (``pipe``: the simulator's end), and kill it by its
    pid if it has not within 10 s."""
    pipe.send("stop")
    store.join(timeout=10)
    if store.is_alive() and store.pid is not None:
        os.kill(store.pid, signal.SIGKILL)


def end_workers(workers: Iterable[Any], terminate: bool = False) -> None:
    """Wait for the worker processes (SIGTERM first where ``terminate``), each killed by its
    pid if it has not ended within 30 s."""
    workers = list(workers)
    if terminate:
        for proc in workers:
            if proc.pid is not None and proc.is_alive():
                os.kill(proc.pid, signal.SIGTERM)
    for proc in workers:
        proc.join(timeout=30)
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, signal.SIGKILL)


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK  # utime + stime


def proc_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
