"""Instrument torch.distributed as soon as torch is imported (what ``cclctl run`` arranges).

Importing torch costs seconds, so nothing is imported ahead of the script: a finder on
``sys.meta_path`` waits for ``import torch`` (which imports torch.distributed too) and
instruments once torch's package has finished loading. Processes that never import torch
(a launcher, a shell) pay one list lookup per import. Where ``CCLCTL_TORCH_BACKEND`` is set
(``cclctl run --backend cclctl``), the job's gloo groups are then moved onto the ``cclctl``
backend (:mod:`~cclctl.integrations.torch.backend_choice`), after the instrumentation, so
the wrapper never sees them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

TARGET = "torch"


def arm() -> None:
    """Instrument now if torch is loaded, else as soon as it is. Idempotent."""
    if TARGET in sys.modules:
        _instrument()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def _instrument() -> None:
    try:
        from cclctl.integrations.torch.wrap import instrument

        instrument()
    except Exception as exc:  # the job runs as it would without cclctl
        print(f"cclctl run: torch.distributed is not instrumented: {exc}", file=sys.stderr)
    _choose_backend()


def _choose_backend() -> None:
    """Move the groups ``CCLCTL_TORCH_BACKEND`` names onto cclctl. A job that cannot be
    moved must not run on gloo unnoticed: the error ends the process."""
    from cclctl.config import environment
    from cclctl.integrations.torch import backend_choice

    try:
        backend_choice.install(backend_choice.from_env(environment()))
    except Exception as exc:
        print(f"cclctl run: the job cannot run on the cclctl backend: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of ``torch`` to instrument after it ran."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)  # once: the real finders answer from here on
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader: Any = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _instrument()

        loader.exec_module = exec_module
        return spec
