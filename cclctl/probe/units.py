"""Bandwidths, latencies and ratios as people read them (decimal units, as NICs are sold)."""

from __future__ import annotations


def format_bw(bytes_per_s: float) -> str:
    """``23 MB/s``, ``1.25 GB/s``: three significant figures, decimal units."""
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{_sig3(bytes_per_s / scale)} {unit}"
    return f"{_sig3(bytes_per_s)} B/s"


def format_latency(seconds: float) -> str:
    """``12.5 us``, ``1.20 ms``."""
    if seconds >= 1e-3:
        return f"{_sig3(seconds * 1e3)} ms"
    return f"{_sig3(seconds * 1e6)} us"


def format_ratio(ratio: float) -> str:
    """``0.06×``: two decimals below 10, fewer above."""
    return f"{ratio:.2f}×" if ratio < 10 else f"{ratio:.0f}×"


def _sig3(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"
