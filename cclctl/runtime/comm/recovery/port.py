"""The narrow side of the communicator a recovery policy works over, and the policy's own.

A policy (:mod:`~.raising`, :mod:`~.retrying`, :mod:`~.shrinking`) sees a communicator as a
:class:`Port`: who it is, its completed calls and what it kept of them, a rewind of its
calls to an agreed seq, one attempt of a call, and, for a shrink, the survivors' state
taking the place of its own. It never reaches into the communicator's attributes, so a
communicator's internals can change without the policies, and a policy can be tested on a
fake port.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from cclctl.config import RuntimeConfig
from cclctl.runtime.comm.rerun import Kept
from cclctl.runtime.failure import FailureState

if TYPE_CHECKING:
    from cclctl.runtime.comm.collectives import Ending
    from cclctl.runtime.comm.recovery.call import Call
    from cclctl.runtime.comm.recovery.shrink_rules import ShrinkInfo
    from cclctl.runtime.transport.base import Transport


class Port(Protocol):
    """What a recovery policy may use of a communicator."""

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def id(self) -> str: ...
    @property
    def members(self) -> list[int]: ...
    @property
    def cfg(self) -> RuntimeConfig: ...
    @property
    def transport(self) -> Transport: ...
    @property
    def failure(self) -> FailureState: ...

    @property
    def completed(self) -> int:
        """The seq of the last collective call completed here."""

    @property
    def kept(self) -> Kept:
        """What this rank kept of its completed calls, for ranks a fault leaves behind."""

    def rewind(self, seq: int, attempt: int) -> None:
        """Open the calls again from ``seq`` (a retry's agreed plan), for ``attempt``."""

    def attempt(self, call: Call, ending: Ending | None = None) -> Any:
        """Run one attempt of ``call`` on the communicator's current ranks and links."""

    def record(
        self, op: str, arr: np.ndarray, algo: str, *, count: int, nbytes: int
    ) -> AbstractContextManager[Any]:
        """Open a call's record (and seq) where nothing runs in it (a held catch-up seq)."""

    def renew(self, transport: Transport) -> None:
        """Run the next calls over ``transport`` (a retry's renewed links)."""

    def shrink_in_place(self, call: str) -> ShrinkInfo | None:
        """Agree on the survivors (``call`` was interrupted) and run on as their
        communicator, this object kept; what the survivors agreed."""

    def shrunk(self, excluded: list[int]) -> None:
        """Tell the job's callbacks of an automatic shrink that dropped ``excluded``."""


class Recovery(Protocol):
    """What a failure of a call does: one policy per communicator, chosen at its creation
    from the configuration (:func:`cclctl.runtime.comm.recovery.choose`)."""

    def run(self, call: Call) -> Any:
        """Run ``call`` to its result, recovering from the failures the policy covers."""

    def closing(self) -> None:
        """The communicator closes: serve what other ranks still need of it, if anything."""
