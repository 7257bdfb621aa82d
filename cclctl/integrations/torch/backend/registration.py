"""The ``cclctl`` backend's registration with torch.distributed, and its creator.

:func:`register` (run by ``import cclctl.torch``) adds the backend by name for CPU and
CUDA devices, so ``dist.init_process_group("cclctl")``, ``backend="cpu:cclctl"`` and
``backend="cpu:cclctl,cuda:cclctl"`` work (a CUDA tensor goes through the relay:
:mod:`.relayed`).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from cclctl.integrations.torch.backend import joining
from cclctl.integrations.torch.backend.process_group import NAME, CclctlProcessGroup


def register() -> None:
    """Register the ``cclctl`` backend with torch.distributed (once per process)."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, create, extended_api=True, devices=["cpu", "cuda"])


def create(opts: Any, _options: Any = None) -> CclctlProcessGroup:
    """torch's creator: the group of the job's world communicator, or of a sub-group's."""
    return CclctlProcessGroup(joining.communicator(opts))
