"""The agent of a rank process: the one place its per-process services live.

Every front end of a rank (``cclctl.init()``'s communicators, the torch process-group
wrapper) gets them from :func:`for_process`, so a process that runs both has one telemetry,
one watchdog, one status publisher per ``status/<rank>`` key, one dump-request poller, one
exporter and one revoke end.
"""

from __future__ import annotations

from cclctl.runtime.agent.agent import Agent, FailureHooks
from cclctl.runtime.agent.process import current, for_process

__all__ = ["Agent", "FailureHooks", "current", "for_process"]
