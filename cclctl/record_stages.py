"""A relayed call's time per stage, as its trace record carries it (``stages``).

The relay (:mod:`cclctl.runtime.relay`) times each stage of a call staged through host
memory (``d2h``, ``collective``, ``h2d``) in nanoseconds; the record keeps them by name.
This module reads them back from a document, defensively: a few short names, each a
non-negative integer that fits 64 bits.
"""

from __future__ import annotations

from collections.abc import Mapping

from cclctl import limits
from cclctl.comm_info import clip
from cclctl.errors import BadInput

#: the most stages a record may name (the relay has three)
MAX_STAGES = 16
#: the longest stage name
MAX_NAME = 32


def stages_from_dict(data: object, where: str) -> dict[str, int]:
    """A record's ``stages``: at most :data:`MAX_STAGES` names, each of a non-negative integer."""
    if not isinstance(data, Mapping) or len(data) > MAX_STAGES:
        raise _fail(where, f"field 'stages' must be an object of at most {MAX_STAGES} stages")
    for name, ns in data.items():
        if not isinstance(name, str) or len(name) > MAX_NAME:
            raise _fail(where, f"a stage name must be a short string, got {clip(repr(name))}")
        if isinstance(ns, bool) or not isinstance(ns, int) or not 0 <= ns <= limits.MAX_INT:
            raise _fail(
                where, f"stage {name!r} must be a non-negative integer, got {clip(repr(ns))}"
            )
    return dict(data)


def _fail(where: str, why: str) -> BadInput:
    return BadInput(f"{where}: {why}", where=where)
