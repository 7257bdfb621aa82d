"""Moving an unedited job's groups onto the ``cclctl`` backend (``cclctl run --backend``).

``CCLCTL_TORCH_BACKEND`` names the device types whose gloo or NCCL groups run on cclctl's
runtime instead: ``cclctl`` (the same as ``cpu:cclctl``) moves the groups torch would put on
gloo (``init_process_group("gloo")``, or no backend on a host without an accelerator);
``cpu:cclctl,cuda:cclctl`` moves NCCL's too. A group moves whole or not at all: a backend
that is a Python process group (``cclctl``'s is) becomes torch's whole group, every
device's tensors included, so a group whose map keeps a backend this choice does not move
(``cpu:gloo,cuda:nccl`` under plain ``cclctl``) stays as the job asked, with a warning.
A sub-group moves only when the job's world did (a cclctl group is a sub-communicator of a
cclctl world).

:func:`install` wraps torch's ``_new_process_group_helper``, the one function every group
is created through, and rewrites its backend argument; torch then records the group as a
``cclctl`` one (``dist.get_backend()`` says so), and its calls are the runtime's own.
Parsing imports no torch, so ``cclctl run`` checks the value before the job starts.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

from cclctl.errors import ConfigError

log = logging.getLogger("cclctl.torch")

VARIABLE = "CCLCTL_TORCH_BACKEND"
NAME = "cclctl"
#: the device types a choice may name, and the backend each one's groups move from
MOVABLE = {"cpu": ("gloo",), "cuda": ("gloo", "nccl")}
CHOICES = ("cclctl", "cpu:cclctl", "cuda:cclctl", "cpu:cclctl,cuda:cclctl")


def parse(raw: str) -> frozenset[str]:
    """The device types ``raw`` moves onto cclctl (``cclctl``: CPU's); ValueError naming
    the choices for anything else."""
    text = raw.strip().lower()
    if text == NAME:
        return frozenset({"cpu"})
    devices: set[str] = set()
    for pair in text.split(","):
        device, _, backend = pair.strip().partition(":")
        if backend != NAME or device not in MOVABLE or device in devices:
            raise ValueError(
                f"{raw!r} is not a backend cclctl run moves a job onto: give "
                f"{', '.join(CHOICES)} (cclctl: the groups on gloo; cuda:cclctl: NCCL's "
                "too); a job's other backends are its own choice"
            )
        devices.add(device)
    return frozenset(devices)


def from_env(env: Mapping[str, str]) -> frozenset[str]:
    """The devices ``CCLCTL_TORCH_BACKEND`` in ``env`` moves (empty when unset);
    ConfigError naming the variable when its value is not a choice."""
    raw = env.get(VARIABLE, "")
    try:
        return parse(raw) if raw.strip() else frozenset()
    except ValueError as exc:
        raise ConfigError(f"{VARIABLE}: {exc}", variable=VARIABLE) from None


def moved(device_map: Mapping[str, str], devices: frozenset[str]) -> bool:
    """Whether a group whose backends are ``device_map`` (device type -> backend) moves
    onto cclctl when ``devices`` are chosen: every one of its backends is one they move.
    gloo on CUDA moves with CPU's choice (gloo is a host library: one group, both types)."""
    if not device_map or not devices:
        return False
    for device, backend in device_map.items():
        name = str(backend).lower()
        if name == "gloo" and "cpu" in devices:
            continue
        if device in devices and name in MOVABLE.get(device, ()):
            continue
        return False
    return True


def install(devices: frozenset[str]) -> None:
    """Move the groups torch creates from now on whose backends ``devices`` cover."""
    if not devices:
        return
    import torch.distributed as dist

    from cclctl.integrations.torch.backend.registration import register

    register()
    c10d = dist.distributed_c10d
    original = c10d._new_process_group_helper
    if getattr(original, "_cclctl_moves", None) is not None:
        return
    c10d._new_process_group_helper = _wrap(c10d, original, devices)


def _wrap(c10d: Any, original: Callable[..., Any], devices: frozenset[str]) -> Callable[..., Any]:
    params = list(inspect.signature(original).parameters)
    i_backend, i_ranks = params.index("backend"), params.index("global_ranks_in_group")
    world_moved: list[bool] = []  # per init_process_group: whether its world moved

    @functools.wraps(original)
    def helper(*args: Any, **kwargs: Any) -> Any:
        arguments = list(args)
        at = i_backend < len(arguments)
        backend = arguments[i_backend] if at else kwargs.get("backend")
        ranks = (
            arguments[i_ranks] if i_ranks < len(arguments) else kwargs.get("global_ranks_in_group")
        )
        is_world = not ranks
        moving = _moves(c10d, backend, devices) and (is_world or world_moved[-1:] == [True])
        if is_world:
            world_moved.append(moving)
        if moving and at:
            arguments[i_backend] = NAME
        elif moving:
            kwargs["backend"] = NAME
        return original(*arguments, **kwargs)

    helper._cclctl_moves = devices  # type: ignore[attr-defined]
    return helper


def _moves(c10d: Any, backend: Any, devices: frozenset[str]) -> bool:
    """Whether the group torch is creating with ``backend`` moves; a warning when it is
    a gloo or NCCL group the choice covers only in part."""
    try:
        device_map = {
            k: str(v) for k, v in c10d.BackendConfig(backend).get_device_backend_map().items()
        }
    except Exception:
        return False
    if moved(device_map, devices):
        return True
    if any(v.lower() in ("gloo", "nccl") for v in device_map.values()) and any(
        d in device_map for d in devices
    ):
        log.warning(
            "cclctl: a group on %s stays there: %s=%s does not move all of its backends "
            "(a group runs on one backend); ask cpu:cclctl,cuda:cclctl to move NCCL's too",
            ",".join(f"{k}:{v}" for k, v in device_map.items()),
            VARIABLE,
            ",".join(f"{d}:cclctl" for d in sorted(devices)),
        )
    return False
