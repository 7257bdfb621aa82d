"""The diagnosis of a live job, as fetched from its store: one code path for two commands.

``cclctl diagnose hang --store`` prints it and ``cclctl top`` draws its verdict over the
table, so both name the same suspects for the same statuses: the statuses, the reader's
clock at the fetch, the states of the ranks' processes (looked at on this host, else as
their host agents saw them) and how old each status was when its host's agent last wrote
go to the engine the same way.
"""

from __future__ import annotations

from cclctl.diagnose.engine import diagnose
from cclctl.diagnose.model import Diagnosis, Options
from cclctl.diagnose_io.inputs import from_live
from cclctl.diagnose_io.procs import aged_on_host, agents_saw, process_states
from cclctl.live.snapshot import JobStatuses


def diagnose_live(
    statuses: JobStatuses, world_size: int | None = None, options: Options | None = None
) -> Diagnosis:
    """Diagnose ``statuses``; ``world_size`` is the user's flag (None: the job's own word).

    Raises BadInput when no rank has published anything, UsageError when ``world_size`` is
    smaller than a rank seen.
    """
    inputs = from_live(statuses, world_size)
    seen = agents_saw(statuses.hosts.values(), statuses.statuses)
    return diagnose(
        inputs.snapshots,
        world_size=world_size if world_size is not None else inputs.world_size,
        now_ns=inputs.now_ns,
        proc={**seen, **process_states(inputs.snapshots)},
        unreadable=inputs.unreadable,
        notes=inputs.notes,
        remarks=inputs.remarks,
        options=options,
        aged=aged_on_host(statuses.hosts.values(), statuses.statuses),
    )
