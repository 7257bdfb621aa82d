"""Shared by the launcher tests: a rank program with chosen behaviours, and orphan checks."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable

import psutil

PY = sys.executable

# Each rank: print its pid and a grandchild's pid, then behave as its action says. Failing
# actions first wait (through the launcher's store) until every rank is set up, so a rank
# is never stopped before it could install its handlers.
RANK_PROGRAM = r"""
import os, signal, subprocess, sys, time
from cclctl.store.client import StoreClient
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
child = subprocess.Popen(["sleep", "60"])
print(f"pids {os.getpid()} {child.pid}", flush=True)
action = dict(a.split("=") for a in sys.argv[1:]).get(str(rank), "sleep")
if action == "leave":
    sys.exit(0)  # exits at once, leaving its sleeping child behind
if action == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
store = StoreClient.from_address(
    os.environ["CCLCTL_STORE"], connect_timeout_s=10, token=os.environ["CCLCTL_TOKEN"]
)
store.add("ready", 1)
if action.startswith("exit") or action == "kill":
    while int(store.get("ready")) < world:
        time.sleep(0.01)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(action[4:]))
time.sleep(60)
"""


class Lines:
    """An output sink that remembers every (rank, stream, line)."""

    def __init__(self) -> None:
        self.items: list[tuple[int, str, str]] = []

    def __call__(self, rank: int, stream: str, line: str) -> None:
        self.items.append((rank, stream, line))

    def pids(self) -> list[int]:
        found = [line.split()[1:] for _, _, line in self.items if line.startswith("pids ")]
        return [int(pid) for pair in found for pid in pair]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_all_gone(pids: Iterable[int], within_s: float = 3.0) -> None:
    pids = list(pids)
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if alive(p)] == [], "processes outlived the launch"
