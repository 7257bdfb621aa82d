"""Look at the processes behind rank documents, where they run on this host, and take what
the host agents saw of theirs.

A heartbeat alone cannot tell a SIGSTOPped rank from a dead one; the process table can. Only
processes on this host can be seen, and a pid only counts if the process already existed
when the rank wrote its document (otherwise the pid was reused by something else). A rank
elsewhere is known by what its host's agent saw (:func:`agents_saw`), where it has one.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping

import psutil

from cclctl.diagnose.liveness import PROC_GONE, PROC_RUNNING, PROC_STOPPED, PROC_ZOMBIE
from cclctl.host_status import HostDocument
from cclctl.records import RankSnapshot

#: Process start times and document times come from one clock here, but rounding differs.
_START_SLACK_S = 1.0


def this_host() -> str:
    return socket.gethostname()


def process_states(snapshots: Iterable[RankSnapshot], host: str | None = None) -> dict[int, str]:
    """rank -> "running", "stopped", "zombie" or "gone", for ranks whose host is ``host``
    (default: this one). Ranks elsewhere are left out: their state is unknown here.
    """
    here = this_host() if host is None else host
    return {
        snap.rank: process_state(snap.pid, snap.time_ns)
        for snap in snapshots
        if snap.host == here and snap.pid > 0
    }


def agents_saw(
    hosts: Iterable[HostDocument], snapshots: Mapping[int, RankSnapshot]
) -> dict[int, str]:
    """rank -> "stopped", "zombie" or "gone", as the ranks' host agents saw them in their
    last documents: only where the rank's status is of that host and that pid (a rank
    restarted since, or placed elsewhere, is not the process the agent looked at)."""
    seen: dict[int, str] = {}
    for doc in hosts:
        for rank, (pid, state) in doc.procs.items():
            snap = snapshots.get(rank)
            if snap is not None and snap.pid == pid and snap.host == doc.host:
                seen[rank] = state
    return seen


def aged_on_host(
    hosts: Iterable[HostDocument], snapshots: Mapping[int, RankSnapshot]
) -> dict[int, float]:
    """rank -> how old (s) its status was when its host's agent last wrote: the agent's
    time and the rank's heartbeat come from one clock, that host's, so no skew margin is
    owed. A status newer than the document (from the rank's own key) has no such age."""
    aged: dict[int, float] = {}
    for doc in hosts:
        for rank in doc.ranks:
            snap = snapshots.get(rank)
            if snap is not None and snap.host == doc.host and snap.time_ns < doc.time_ns:
                aged[rank] = (doc.time_ns - snap.time_ns) / 1e9
    return aged


def process_state(pid: int, written_ns: int) -> str:
    """The state of ``pid``, if it is the process that wrote a document at ``written_ns``."""
    try:
        proc = psutil.Process(pid)
        status = proc.status()
        created = proc.create_time()
    except psutil.ZombieProcess:
        return PROC_ZOMBIE
    except psutil.NoSuchProcess:
        return PROC_GONE
    except psutil.AccessDenied:
        return PROC_RUNNING  # it exists; another user's process cannot be looked into
    if created > written_ns / 1e9 + _START_SLACK_S:
        return PROC_GONE  # the pid now belongs to a process started after the document
    if status == psutil.STATUS_ZOMBIE:
        return PROC_ZOMBIE
    if status == psutil.STATUS_DEAD:
        return PROC_GONE
    if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
        return PROC_STOPPED
    return PROC_RUNNING


def for_post_mortem(states: dict[int, str]) -> dict[int, str]:
    """Process states worth using with dumps: none once every process has gone (the job
    ended, so "gone" says nothing about the hang); all of them while any still exists.
    """
    alive = any(s in (PROC_RUNNING, PROC_STOPPED) for s in states.values())
    return states if alive else {}
