"""The fallback for records without facts: what an error's words say about peers.

Records written by cclctl carry how a call failed as fields (``CollectiveRecord.fault``,
read by :mod:`cclctl.diagnose.call_facts`); this module reads the same facts out of the
words, only for records that have no such field: dumps and statuses written before the
field existed, and PyTorch Flight Recorder dumps. The patterns are the messages cclctl's
runtime wrote (``runtime/transport/``: the interface, tcp, shm and wire; the revoke error
of ``runtime/comm``); anything else matches nothing. Nothing on the path of a record with
fields uses it, so rewording a message never changes a verdict.
"""

from __future__ import annotations

import re

#: (peer rank, "send" | "recv" | "")
Edge = tuple[int, str]

_TIMEOUT = re.compile(r"waiting to (?P<what>send|recv) (?:to|from) rank (?P<peer>\d+)")
_TCP_BROKE = re.compile(r"link to rank (?P<peer>\d+) broke while (?P<what>sending|receiving)")
_DROPPED = re.compile(r"link to rank (?P<peer>\d+) was dropped")
_PEER_FAILED = re.compile(r"link to rank (?P<peer>\d+) broke in ")  # shm: the peer failed
#: A call revoked by the job's failure names its origin: "... seq 11 revoked: rank 6 (...)
#: died", or "revoked: link between rank 6 and rank 7 broke".
_REVOKED = re.compile(r" revoked: (?:link between )?rank (?P<peer>\d+)\b")
_MISMATCH = re.compile(
    r"collective mismatch: rank \d+ called \w+\([^)]*\) at seq (?P<seq>\d+) epoch \d+ "
    r"but peer (?P<peer>\d+) called (?P<theirs>\w+\([^)]*\)) at seq (?P<pseq>\d+)"
)


def waited_on(error: str | None) -> Edge | None:
    """The peer a failed call was waiting for, when its error names one."""
    if not error:
        return None
    if m := _REVOKED.search(error):
        return int(m["peer"]), ""
    if m := _TIMEOUT.search(error):
        return int(m["peer"]), m["what"]
    if m := _TCP_BROKE.search(error):
        return int(m["peer"]), "send" if m["what"] == "sending" else "recv"
    if m := _DROPPED.search(error) or _PEER_FAILED.search(error):
        return int(m["peer"]), ""
    return None


def revoked(error: str | None) -> bool:
    """The call was revoked by the job's failure (its error names the origin)."""
    return " revoked: " in (error or "")


def broken_link(error: str | None) -> int | None:
    """The peer at the far end of a link this call saw break (not a peer that failed)."""
    if not error:
        return None
    own = error.split(" revoked: ", 1)[0]  # the origin's words after it are not this call's
    m = _DROPPED.search(own) or _TCP_BROKE.search(own)
    return int(m["peer"]) if m else None


def mismatch_claim(error: str | None, seq: int) -> tuple[int, str] | None:
    """(peer, what the peer called, in the runtime's words) from a mismatch at ``seq``."""
    m = _MISMATCH.search(error or "")
    if m is None or not int(m["seq"]) == int(m["pseq"]) == seq:
        return None  # a peer at another seq is a different story (a skipped call)
    return int(m["peer"]), m["theirs"]
