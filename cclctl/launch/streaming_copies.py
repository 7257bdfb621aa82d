"""Large copies that stream past the cache, for the ranks cclctl launches.

glibc's ``memcpy`` (numpy's copies use it) switches to non-temporal stores above a threshold
it derives from the L3 size the CPU reports. Virtual machines often report the host's whole
L3 (hundreds of MiB), which puts that threshold far above any copy: every smaller copy
first reads each destination line it is about to overwrite, which roughly halves a large
copy's speed. Collectives on shared buffers copy whole shares between ranks, so they are
bound by exactly this.

Below a few MiB streaming stores lose: a peer reads a reduced share right after it is
written, and it should find it in cache. 32 MiB keeps those in cache and streams what
cannot stay there anyway.

glibc reads the threshold once, when a process starts (``GLIBC_TUNABLES``), so the launcher
sets it for its ranks. A threshold the user already gave glibc wins; ``CCLCTL_STREAMING_COPY
=0`` leaves glibc's own. Ranks started by other launchers can set the same variable.
"""

from __future__ import annotations

from collections.abc import Mapping

from cclctl.errors import ConfigError
from cclctl.runtime.comm.selection import parse_bytes

VARIABLE = "CCLCTL_STREAMING_COPY"
TUNABLE = "glibc.cpu.x86_non_temporal_threshold"
DEFAULT_BYTES = 32 << 20
#: glibc refuses thresholds below this (``ld.so --list-tunables``) and keeps its default.
MIN_BYTES = 0x4040


def threshold(env: Mapping[str, str]) -> int:
    """Copies of at least this many bytes stream past the cache (0: glibc decides)."""
    raw = env.get(VARIABLE, "").strip()
    if not raw:
        return DEFAULT_BYTES
    if raw.lower() in ("0", "off"):
        return 0
    try:
        value = parse_bytes(raw)
    except ValueError:
        value = -1
    if value < MIN_BYTES:
        raise ConfigError(
            f"{VARIABLE}={raw!r} is not valid: expected a size of at least 16K (like 32M), "
            "or 0 to leave glibc's own threshold",
            variable=VARIABLE,
        )
    return value


def rank_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``GLIBC_TUNABLES`` naming the streaming threshold, unless the user set
    one there already or turned it off. Other tunables in the variable are kept."""
    out = dict(env)
    value = threshold(env)
    tunables = env.get("GLIBC_TUNABLES", "")
    if value == 0 or TUNABLE in tunables:
        return out
    setting = f"{TUNABLE}={value}"
    out["GLIBC_TUNABLES"] = f"{tunables}:{setting}" if tunables else setting
    return out
