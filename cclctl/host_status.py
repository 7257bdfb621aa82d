"""A host's statuses as one document: what a host agent writes to the job's store.

A host agent (:mod:`cclctl.runtime.hostagent`) gathers the statuses its host's ranks send it
and writes them, once per status interval, under ``cclctl/<job>/host/<hostname>``: one
write per host instead of one per rank. Beside the statuses the document carries a summary
a diagnosis can start from without reading them (per communicator, the lowest and highest
seq its ranks started and completed, and the ranks at the lowest completed one), and the
ranks whose connection to the agent ended (``left``: how, and when), and the ranks whose
process the agent saw stopped or gone (``procs``: the agent is on their host and looks at
each rank's process by the pid of its connection, so a reader anywhere tells a stopped or
dead rank from one merely slow to publish, as it does for the ranks of its own host).

The statuses stay the ranks' own documents, kept as the text each rank sent (a JSON
string in the host's document): a reader parses the host's document without parsing its
ranks' statuses, and then parses only those it needs, each checked as one rank's
(:mod:`cclctl.live.snapshot`), so one rank's broken status is never its host's problem.

With it, in the same store request, the agent writes the document's *head* under
``cclctl/<job>/head/<hostname>``: all of it but the statuses, which it names (``ranks``).
A reader of a large job lists the heads (a kilobyte a host) and reads the few documents it
needs whole (:mod:`cclctl.live.heads`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping
from typing import Any

from cclctl.comm_info import clip
from cclctl.errors import BadInput
from cclctl.status_digest import digest, is_count

SCHEMA = "cclctl.host"
VERSION = 1
#: the key (in the job's scope) a host's document lives under: ``host/<hostname>``
KEY = "host/"
#: ... and its head: ``head/<hostname>``
HEAD_KEY = "head/"
#: ranks named as behind, per communicator, at most (a host has a handful of ranks)
MAX_BEHIND = 16
#: A rank's process as a look at it on its host finds it: what ``procs`` names (a running
#: process is left out) and the words of the diagnosis' process states.
PROC_RUNNING = "running"
PROC_STOPPED = "stopped"  # SIGSTOP, Ctrl-Z or a debugger (state T)
PROC_ZOMBIE = "zombie"
PROC_GONE = "gone"


@dataclasses.dataclass
class HostDocument:
    """One host's document: its agent (``pid``), when it wrote it (``time_ns``, wall
    clock), its ranks' statuses as the text they sent (by rank), the ranks whose
    connection ended (rank -> why, in words), the summary, and the ranks whose process is
    not running (rank -> (pid, :data:`PROC_STOPPED`, :data:`PROC_ZOMBIE` or
    :data:`PROC_GONE`)) when the agent looked, at ``time_ns``."""

    host: str
    pid: int
    time_ns: int
    interval_s: float
    statuses: dict[int, str]
    left: dict[int, str] = dataclasses.field(default_factory=dict)
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    procs: dict[int, tuple[int, str]] = dataclasses.field(default_factory=dict)
    #: a head's ranks (it holds none of their statuses); empty for a whole document
    listed: tuple[int, ...] = ()

    @property
    def ranks(self) -> Collection[int]:
        """The ranks whose statuses the document holds (a head: names)."""
        return self.statuses.keys() if self.statuses else self.listed

    @property
    def is_head(self) -> bool:
        return not self.statuses and bool(self.listed)

    def to_bytes(self) -> bytes:
        statuses = {str(rank): doc for rank, doc in sorted(self.statuses.items())}
        return self._dumps({"statuses": statuses})

    def head_bytes(self) -> bytes:
        """The document's head: all of it but the statuses, whose ranks it lists."""
        return self._dumps({"ranks": sorted(self.statuses)})

    def _dumps(self, rest: dict[str, Any]) -> bytes:
        procs = {str(r): {"pid": pid, "state": state} for r, (pid, state) in self.procs.items()}
        return json.dumps(
            {
                "schema": SCHEMA,
                "version": VERSION,
                "host": self.host,
                "pid": self.pid,
                "time_ns": self.time_ns,
                "interval_s": self.interval_s,
                "summary": self.summary,
                "left": {str(rank): why for rank, why in sorted(self.left.items())},
                **({"procs": procs} if procs else {}),
                **rest,
            },
            separators=(",", ":"),
        ).encode()


def summarize(
    statuses: Mapping[int, Any], texts: Mapping[int, str] | None = None
) -> dict[str, Any]:
    """Per communicator: the range of seqs the ranks started and completed, and the ranks
    at the lowest completed seq where not every rank is there (bounded by
    :data:`MAX_BEHIND`); per rank with a plain status, its digest
    (:mod:`cclctl.status_digest`; ``texts``: the text each was decoded from, without
    which no rank has one). Statuses that do not have the shape are skipped (the
    reader reports them, rank by rank)."""
    seqs: dict[str, list[tuple[int, int, int]]] = {}
    for rank, doc in statuses.items():
        comms = doc.get("comms") if isinstance(doc, dict) else None
        if not isinstance(comms, dict):
            continue
        for comm, info in comms.items():
            started = info.get("last_started") if isinstance(info, dict) else None
            completed = info.get("last_completed") if isinstance(info, dict) else None
            if is_count(started) and is_count(completed):
                seqs.setdefault(str(comm), []).append((rank, started, completed))
    out: dict[str, Any] = {}
    for comm, rows in sorted(seqs.items()):
        lowest = min(done for _, _, done in rows)
        highest = max(done for _, _, done in rows)
        behind = (
            sorted(rank for rank, _, done in rows if done == lowest) if lowest < highest else []
        )
        out[comm] = {
            "ranks": len(rows),
            "started": [min(s for _, s, _ in rows), max(s for _, s, _ in rows)],
            "completed": [lowest, highest],
            "behind": behind[:MAX_BEHIND],
        }
    digests = {}
    for rank, text in (texts or {}).items():
        doc = statuses.get(rank)
        row = digest(doc, text) if _names(doc, rank) else None
        if row is not None:
            digests[str(rank)] = row
    return {"comms": out, "digests": digests}


def _names(doc: object, rank: int) -> bool:
    """Whether a status says it is ``rank`` of its world (a reader refuses one that does
    not: a rank made from a model has its key's rank)."""
    if not isinstance(doc, dict):
        return False
    said, size = doc.get("rank"), doc.get("world_size")
    return type(said) is int and said == rank and type(size) is int and 0 <= rank < size


def document_name(host: str) -> str:
    """How a reader names ``host``'s document in what it says of it."""
    return f"host document {clip(host, 60)!r}"


def parse(value: bytes, where: str) -> HostDocument:
    """A host document (or its head) from the store; BadInput (naming ``where``) if it is
    not one."""
    try:
        data = json.loads(value)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadInput(f"{where}: not valid JSON ({exc})", where=where) from None
    except RecursionError:
        raise BadInput(f"{where}: JSON nested too deeply", where=where) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise BadInput(f"{where}: not a {SCHEMA} document", where=where)
    head = "statuses" not in data and "ranks" in data  # a document's head names its ranks
    statuses, left = data.get("statuses", {} if head else None), data.get("left", {})
    listed = _listed(data["ranks"], where) if head else ()
    if not isinstance(statuses, dict) or not isinstance(left, dict):
        raise BadInput(f"{where}: 'statuses' and 'left' must be maps by rank", where=where)
    host, pid, time_ns = data.get("host"), data.get("pid"), data.get("time_ns")
    interval = data.get("interval_s")
    if not isinstance(host, str) or not is_count(pid) or not is_count(time_ns):
        raise BadInput(f"{where}: 'host', 'pid' and 'time_ns' are required", where=where)
    if not isinstance(interval, int | float) or isinstance(interval, bool) or interval <= 0:
        raise BadInput(f"{where}: 'interval_s' must be a positive number", where=where)
    summary = data.get("summary", {})
    procs = data.get("procs", {})
    if not isinstance(procs, dict):
        raise BadInput(f"{where}: 'procs' must be a map by rank", where=where)
    return HostDocument(
        host=host,
        pid=pid,
        time_ns=time_ns,
        interval_s=float(interval),
        statuses={_rank(text, where): _text(doc) for text, doc in statuses.items()},
        left={_rank(text, where): str(why) for text, why in left.items()},
        summary=summary if isinstance(summary, dict) else {},
        procs={_rank(text, where): _proc(seen, where) for text, seen in procs.items()},
        listed=listed,
    )


def _listed(ranks: object, where: str) -> tuple[int, ...]:
    """A head's ``ranks``: a list of distinct ranks."""
    if type(ranks) is not list or not all(type(r) is int and 0 <= r < 10**9 for r in ranks):
        raise BadInput(f"{where}: a head's 'ranks' must be a list of ranks", where=where)
    if len(set(ranks)) != len(ranks):
        raise BadInput(f"{where}: a head names a rank twice", where=where)
    return tuple(ranks)


def _proc(seen: object, where: str) -> tuple[int, str]:
    """A ``procs`` entry: the pid the agent looked at and what it found."""
    pid = seen.get("pid") if isinstance(seen, dict) else None
    state = seen.get("state") if isinstance(seen, dict) else None
    if not is_count(pid) or state not in (PROC_STOPPED, PROC_ZOMBIE, PROC_GONE):
        words = f"{PROC_STOPPED!r}, {PROC_ZOMBIE!r} or {PROC_GONE!r}"
        raise BadInput(f"{where}: a 'procs' entry is a pid and a state ({words})", where=where)
    return pid, str(state)


def _text(doc: object) -> str:
    """A status as text (a writer that embedded it as an object: its JSON again)."""
    return doc if isinstance(doc, str) else json.dumps(doc)


def _rank(text: str, where: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise BadInput(f"{where}: {text[:20]!r} is not a rank", where=where)
    return int(text)
