"""Shared test setup: the helpers in tests/ importable, and a store for tests that need one."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cclctl.store.client import StoreClient, StoreServer

sys.path.insert(0, str(Path(__file__).parent / "support"))


@pytest.fixture(autouse=True, scope="session")
def _private_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Job folders (token files, default dumps) of every test under pytest's own temporary
    folder, never the real ``${TMPDIR:-/tmp}/cclctl-<uid>/``: ranks inherit TMPDIR; and
    short-lived lingering stores."""
    old = {name: os.environ.get(name) for name in ("TMPDIR", "CCLCTL_STORE_LINGER")}
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("tmpdir"))
    # the stores that launched jobs leave behind serve a reader briefly, then go
    os.environ.setdefault("CCLCTL_STORE_LINGER", "3")
    yield
    for name, value in old.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def server() -> Iterator[StoreServer]:
    """A real store on a free loopback port."""
    with StoreServer() as srv:
        yield srv


@pytest.fixture
def client(server: StoreServer) -> Iterator[StoreClient]:
    with StoreClient("127.0.0.1", server.port, timeout_s=10, connect_timeout_s=5) as c:
        yield c
