"""cclctl: observability and fault diagnosis for collective communication.

``cclctl.init()`` joins a job (from torchrun/Slurm/Open MPI/``cclctl launch`` variables) and
returns a :class:`~cclctl.runtime.comm.communicator.Communicator` with torch.distributed-style
collectives on numpy arrays. Nothing is imported or started until it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from cclctl.runtime.comm.communicator import Communicator


def init(**kwargs: Any) -> Communicator:
    """Join the job and return the world communicator; see :func:`cclctl.runtime.job.init`."""
    from cclctl.runtime.job.init import init as _init

    return _init(**kwargs)


__all__ = ["__version__", "init"]
