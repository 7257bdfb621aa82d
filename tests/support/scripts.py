"""Where the worker scripts that tests run as rank processes live."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).parent


def script(name: str) -> str:
    """The path of the worker script ``name`` in tests/support."""
    path = SUPPORT / name
    if not path.is_file():
        raise FileNotFoundError(path)
    return str(path)
