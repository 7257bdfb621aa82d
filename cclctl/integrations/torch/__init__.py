"""cclctl's telemetry for torch.distributed jobs: ``instrument()`` and ``uninstrument()``.

Importing this package imports no torch; :func:`instrument` does, when it is called.
"""

from cclctl.integrations.torch.wrap import instrument, session, uninstrument

__all__ = ["instrument", "session", "uninstrument"]
