"""The rank a live hang waits on, as a watchdog that just expired a call asks for it.

A rank's watchdog sees only its own neighbour (in a ring every rank waits on the one
before it), so when it expires a call it asks the diagnosis of the job's statuses which
rank the hang comes from, the same verdict ``cclctl top`` shows, and names that rank in
the job's revoke record.
"""

from __future__ import annotations

from cclctl.diagnose import model
from cclctl.diagnose.model import Options
from cclctl.diagnose.revoke_verdict import HANG_REASONS
from cclctl.diagnose_io.live import diagnose_live
from cclctl.errors import CclError
from cclctl.live.snapshot import JobStatuses

#: The diagnosis' verdict kinds as revoke-record kinds and what the reason says of the rank.
_WORDS = {
    model.DEAD: ("died", "process exited"),
    **{kind: ("hang", words) for kind, words in HANG_REASONS.items()},
    model.MISMATCH: ("mismatch", "called another collective at {call}"),
    model.LINK: ("link", "does not answer on its link"),
}


def hang_suspect(
    statuses: JobStatuses, stuck_after_s: float, stale_after_s: float
) -> tuple[int, str, str, int | None, str] | None:
    """(rank, kind, reason, peer, symptom) of the first suspect of the live diagnosis
    (``symptom``: a hang's verdict kind, empty for other kinds), or None when it names none
    (the statuses show no fault yet, or cannot be read). The watchdog knows the call is
    hung: ``stuck_after_s`` (half its timeout) is when a call in flight counts as hung,
    ``stale_after_s`` when a heartbeat counts as stale."""
    options = Options(stale_after_s=stale_after_s, stuck_after_s=stuck_after_s)
    try:
        diagnosis = diagnose_live(statuses, options=options)
    except CclError:
        return None
    for verdict in diagnosis.faults:
        if not verdict.suspects or verdict.kind not in _WORDS or verdict.shrunk_away:
            continue  # a rank a shrink left out holds up nothing the survivors run
        kind, words = _WORDS[verdict.kind]
        symptom = verdict.kind if kind == "hang" else ""
        call = f"{verdict.op} seq {verdict.seq}" if verdict.op else "the collective"
        peer = None
        if verdict.link is not None:
            a, b = verdict.link
            peer = b if a == verdict.suspects[0].rank else a
        return verdict.suspects[0].rank, kind, words.format(call=call), peer, symptom
    return None
