"""Fixtures of the runtime tests that span two network-namespace "hosts"."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from netns_job import TwoHosts


@pytest.fixture(scope="module")
def hosts() -> Iterator[TwoHosts]:
    """Two hosts (namespaces h1 and h2 and their veth pair) for one test module's jobs,
    removed afterwards."""
    two = TwoHosts()
    try:
        yield two
    finally:
        two.close()
