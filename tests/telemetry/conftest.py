"""Fixtures for the telemetry tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from telemetry_helpers import config

from cclctl.telemetry.hub import Telemetry


@pytest.fixture
def make_tel() -> Iterator[Callable[..., Telemetry]]:
    """Build Telemetry objects and always close them (threads, ports, hooks)."""
    made: list[Telemetry] = []

    def make(rank: int = 0, world_size: int = 4, **changes: object) -> Telemetry:
        tel = Telemetry(config(**changes), rank=rank, world_size=world_size)
        made.append(tel)
        return tel

    yield make
    for tel in made:
        tel.close()
        tel.remove_hooks()
