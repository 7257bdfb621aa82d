"""``import cclctl.torch``: registers the ``cclctl`` backend with torch.distributed.

Then ``dist.init_process_group("cclctl")`` (or ``backend="cpu:cclctl"``) runs the job's
collectives on cclctl's runtime, recorded by its telemetry like any cclctl job's
(``docs/torch.md``, "Running a job on cclctl's runtime").
"""

from __future__ import annotations

from cclctl.integrations.torch.backend.process_group import NAME
from cclctl.integrations.torch.backend.registration import register

register()

__all__ = ["NAME", "register"]
