"""The relay: collectives on device buffers staged through host memory, chunked and
pipelined, each stage timed (``docs/performance.md``, "The relay").

Numpy only: devices are reached through a :class:`~.copier.Copier` (the torch one is
``cclctl.integrations.torch.relay``).
"""
