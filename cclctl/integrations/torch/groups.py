"""Every process group torch creates while instrumented is a cclctl wrapper around the real one.

torch builds groups in ``_new_process_group_helper`` (``init_process_group``, ``new_group``
and the subgroup helpers all go through it). While instrumented, that function is called
with cclctl's plugin backend (``Backend.register_backend``) in place of gloo or NCCL; the
plugin builds the real backends exactly as torch would (store prefixes, options, sequence
numbers) and returns a :mod:`~cclctl.integrations.torch.traced` wrapper, which torch then
uses as the group itself (its rule for plugins that return a ``ProcessGroup``). The
backend name torch keeps for the group is put back, so ``dist.get_backend()`` still says
``gloo`` or ``nccl``. Groups of other backends (MPI, UCC, other plugins) are left alone.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

from cclctl.integrations.torch.session import Session
from cclctl.integrations.torch.traced import TorchTracer, group_class

log = logging.getLogger("cclctl.torch")

#: the wrapper's plugin name (internal; "cclctl" is the runtime's backend: cclctl.torch)
PLUGIN = "cclctl_traced"
WRAPPED = frozenset({"gloo", "nccl"})


class _Pending(threading.local):
    """The real backend of the group being created on this thread (None: not ours)."""

    backend: str | None = None
    device_id: Any = None


class Groups:
    """Creates wrapper groups; ``session()`` is the live session the wrappers report to."""

    def __init__(self, dist: Any, session: Callable[[], Session | None]) -> None:
        import torch

        self._dist = dist
        self._torch = torch
        self._session = session
        self._pending = _Pending()
        self._cls = group_class(dist)
        self.original: Callable[..., Any] | None = None

    def install(self) -> None:
        """Register the plugin (once per process) and wrap ``_new_process_group_helper``."""
        backend = self._dist.Backend
        if PLUGIN.upper() not in backend._plugins:
            backend.register_backend(PLUGIN, _creator, extended_api=True, devices=["cpu", "cuda"])
        _CREATORS[:] = [self._create]
        c10d = self._dist.distributed_c10d
        self.original = c10d._new_process_group_helper
        c10d._new_process_group_helper = self._wrap(self.original)

    def uninstall(self) -> None:
        """Put torch's helper back; groups made meanwhile stay wrapped (and go quiet)."""
        if self.original is not None:
            self._dist.distributed_c10d._new_process_group_helper = self.original
            self.original = None
        _CREATORS.clear()

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        params = list(inspect.signature(original).parameters)
        i_backend = params.index("backend")
        i_device = params.index("device_id") if "device_id" in params else len(params)

        @functools.wraps(original)
        def helper(*args: Any, **kwargs: Any) -> Any:
            args_list = list(args)
            at = i_backend < len(args_list)
            backend = args_list[i_backend] if at else kwargs.get("backend")
            real = self._wrappable(backend)
            if real is None:
                return original(*args, **kwargs)
            if at:
                args_list[i_backend] = PLUGIN
            else:
                kwargs["backend"] = PLUGIN
            pending = self._pending
            pending.backend = str(backend)
            pending.device_id = args[i_device] if i_device < len(args) else kwargs.get("device_id")
            try:
                pg, store = original(*args_list, **kwargs)
            finally:
                pending.backend = pending.device_id = None
            if isinstance(pg, self._cls):
                world = self._dist.distributed_c10d._world
                world.pg_map[pg] = (backend, store)
                world.pg_backend_config[pg] = real
            return pg, store

        return helper

    def _wrappable(self, backend: Any) -> str | None:
        """The backend config torch would give ``backend`` when each device's backend is
        gloo or NCCL (and torchcomms is off), else None."""
        c10d = self._dist.distributed_c10d
        try:
            if getattr(c10d, "_use_torchcomms_enabled", lambda: False)():
                return None
            config = c10d.BackendConfig(backend)
            if not set(config.get_device_backend_map().values()) <= WRAPPED:
                return None
            return str(config)
        except Exception:
            return None

    def _create(self, opts: Any, backend_options: Any) -> Any:
        """The plugin's creator: the real backends of the pending group, and the wrapper."""
        pending_backend, device_id = self._pending.backend, self._pending.device_id
        if pending_backend is None:
            raise RuntimeError("cclctl's backend wraps gloo or nccl; it is not chosen by name")
        c10d, torch = self._dist.distributed_c10d, self._torch
        base_store = opts.store.underlying_store  # torch's per-group prefix store
        rank, size = opts.group_rank, opts.group_size
        inner = c10d.ProcessGroup(base_store, rank, size)
        tracer = TorchTracer(self._session, inner, torch.Tensor)
        wrapper = self._cls(inner, tracer)
        device_map = c10d.BackendConfig(pending_backend).get_device_backend_map()
        shared = len(set(device_map.values())) == 1  # one backend for every device
        built: Any = None
        for device, name in device_map.items():
            if built is None or not shared:
                store = c10d.PrefixStore(f"{device}/", base_store)
                built = _backend(c10d, name, store, opts, backend_options, device_id)
            kind = getattr(c10d.ProcessGroup.BackendType, name.upper())
            for pg in (inner, wrapper):
                pg._register_backend(torch.device(device), kind, built)
            tracer.backends[device] = built
        kind = "NCCL" if "nccl" in device_map.values() else "GLOO"
        for pg in (inner, wrapper):
            pg._set_default_backend(getattr(c10d.ProcessGroup.BackendType, kind))
            if device_id is not None:
                pg.bound_device_id = device_id
        return wrapper


def _backend(c10d: Any, name: str, store: Any, opts: Any, options: Any, device_id: Any) -> Any:
    """One real backend, built as torch's ``_new_process_group_helper`` builds it."""
    rank, size, timeout = opts.group_rank, opts.group_size, opts.timeout
    ranks, group_name = list(opts.global_ranks_in_group), opts.group_id
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(milliseconds=int(timeout.total_seconds() * 1000))
    if name == "gloo":
        backend = c10d.ProcessGroupGloo(store, rank, size, timeout=timeout)
        backend.options.global_ranks_in_group = ranks
        backend.options.group_name = group_name
    else:
        if options is None:
            options = c10d.ProcessGroupNCCL.Options()
            options.is_high_priority_stream = False
        options._timeout = timeout
        split_from = _split_source(c10d)
        if split_from is not None:
            options.split_from = split_from
            options.split_color = c10d._process_group_color(ranks)
        options.global_ranks_in_group = ranks
        options.group_name = group_name
        backend = c10d.ProcessGroupNCCL(store, rank, size, options)
    backend._set_sequence_number_for_group()
    return backend


def _split_source(c10d: Any) -> Any:
    """The group NCCL splits new groups from, as torch picks it (None: no split)."""
    try:
        if c10d.is_initialized() and c10d._get_default_group().bound_device_id:
            return c10d._get_split_source(c10d._get_default_group())
    except Exception:
        return None
    return None


#: The creator of the installed :class:`Groups` (torch keeps the first plugin registered
#: under a name, so the plugin calls through this list to whichever instrument() is live).
_CREATORS: list[Callable[[Any, Any], Any]] = []


def _creator(opts: Any, backend_options: Any) -> Any:
    if not _CREATORS:
        raise RuntimeError("cclctl's backend is used only while cclctl instruments the job")
    return _CREATORS[0](opts, backend_options)
