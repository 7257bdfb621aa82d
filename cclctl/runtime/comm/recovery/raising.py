"""The policy with recovery off: a failed call raises its error (the default)."""

from __future__ import annotations

from typing import Any

from cclctl.runtime.comm.recovery.call import Call
from cclctl.runtime.comm.recovery.port import Port


class Raising:
    """Each call runs once on ``port``'s communicator; a failure is the caller's."""

    def __init__(self, port: Port) -> None:
        self.port = port

    def run(self, call: Call) -> Any:
        return self.port.attempt(call)

    def closing(self) -> None:
        """Nothing to serve."""
