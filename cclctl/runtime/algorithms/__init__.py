"""Collective algorithms, written once against the transport interface.

Each function takes a :class:`~cclctl.runtime.algorithms.context.Step` context and flat,
contiguous numpy arrays; it describes every step as the sends and receives of that step and
lets the transport move the bytes. They never allocate per call beyond the scratch pool.
"""
