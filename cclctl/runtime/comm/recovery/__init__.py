"""What a failed call does, as one policy per communicator behind one interface
(:class:`~.port.Recovery`), over a narrow side of the communicator (:class:`~.port.Port`).

- :mod:`~.raising`: the call raises (the default);
- :mod:`~.retrying`: ``CCLCTL_RETRY_BUDGET``, a call a link fault interrupted re-runs on
  renewed links (what the ranks bring and agree on: :mod:`~.retry_rules`; the plan they
  make from it: :mod:`~.retry_plan`; each call's inputs: :mod:`~.rerun_inputs`);
- :mod:`~.shrinking`: ``CCLCTL_ON_FAILURE=shrink``, a call a dead rank interrupted re-runs
  among the survivors (which calls can: :mod:`~.shrink_rules`).

A call is a value (:class:`~.call.Call`), so a communicator's op is one line: its call
handed to its policy.
"""

from __future__ import annotations

from cclctl.runtime.comm.recovery import retry_rules
from cclctl.runtime.comm.recovery.port import Port, Recovery
from cclctl.runtime.comm.recovery.raising import Raising
from cclctl.runtime.comm.recovery.retry_rules import Retrier
from cclctl.runtime.comm.recovery.retrying import Retrying
from cclctl.runtime.comm.recovery.shrinking import Shrinking


def choose(port: Port, *, shrinks: bool, retrier: Retrier | None) -> Recovery:
    """The policy of ``port``'s communicator: shrink where the job asked for it and can
    (``shrinks``: ``CCLCTL_ON_FAILURE=shrink`` with a shrinker), else retry where a retrier
    is there and retry is on (:func:`~.retry_rules.enabled`), else raise."""
    if shrinks:
        return Shrinking(port)
    if retrier is not None and retry_rules.enabled(port):
        return Retrying(port, retrier)
    return Raising(port)
