"""How a rank's uncaught cclctl error is printed: the one line the error already is.

A collective that fails raises an error whose message names the origin of the job's failure
(``rank 0: all_reduce(...) seq 5 revoked: rank 2 (pid 81 on vm) died (SIGKILL, seen by rank
1); dumps in ...``). Python's default hook would print it under a chained traceback of some
forty lines through the runtime's internals, the same on every surviving rank, where the
one line says all a user needs; the internals are for whoever debugs cclctl itself, who
asks for them with ``CCLCTL_DEBUG=1``. Anything that is not a cclctl error, and every error
in a process whose own code replaced ``sys.excepthook`` (its presentation is its owner's),
goes to the previous hook untouched.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Protocol

from cclctl.errors import CclError


class ExceptHook(Protocol):
    def __call__(
        self, etype: type[BaseException], value: BaseException, tb: TracebackType | None, /
    ) -> None: ...


def report(
    etype: type[BaseException],
    value: BaseException,
    tb: TracebackType | None,
    previous: ExceptHook,
    brief: bool,
) -> None:
    """Print an uncaught exception: a cclctl error as its message alone on stderr when
    ``brief`` and ``previous`` is Python's own hook; anything else through ``previous``."""
    if brief and isinstance(value, CclError) and previous is sys.__excepthook__:
        try:
            sys.stderr.write(f"{value}\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed or gone: nothing is left to tell
            pass
        return
    previous(etype, value, tb)
