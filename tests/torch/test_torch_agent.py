"""cclctl.init() and the torch wrapper in one process share the rank's agent: one
telemetry, one status publisher for ``status/<rank>``, one dump-request poller, one
watchdog and one revoke listener, ended by the last front end to close."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import cclctl
from cclctl import revocation
from cclctl.integrations.torch import wrap as cclctl_torch
from cclctl.records import CollectiveRecord
from cclctl.runtime import agent as agents
from cclctl.store.client import StoreClient, StoreServer

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

TOKEN = "a-token-for-the-agent-test-0123456789abcdef"
SERVICES = ("cclctl-status", "cclctl-dump-requests", "cclctl-watchdog")


def _threads(prefix: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]


@pytest.fixture
def store() -> Iterator[StoreServer]:
    with StoreServer("127.0.0.1", 0, token=TOKEN) as srv:
        yield srv


@pytest.mark.timeout(60)
def test_both_front_ends_of_a_rank_share_one_agent(
    store: StoreServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"127.0.0.1:{store.port}"
    monkeypatch.setenv("CCLCTL_STORE", address)  # where the torch side finds the job's store
    monkeypatch.setenv("CCLCTL_TOKEN", TOKEN)
    listeners = ("cclctl-revoke-r",)  # the one revoke end's listener
    before = {name: len(_threads(name)) for name in (*SERVICES, *listeners)}
    comm = cclctl.init(
        rank=0, world_size=1, store=address, token=TOKEN, trace_dir=str(tmp_path), timeout_s=30
    )
    cclctl_torch.instrument(trace_dir=str(tmp_path), timeout_s=30)
    try:
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1
        )
        sess = cclctl_torch.session()
        agent = agents.current(0)
        assert sess is not None and agent is not None
        assert sess.agent is agent and sess.telemetry is agent.telemetry
        assert sess.store is not None and sess.store.link is agent.status
        for name in SERVICES:
            assert len(_threads(name)) == before[name] + 1, (name, _threads(name))
        revoke = [name for prefix in listeners for name in _threads(prefix)]
        assert len(revoke) == sum(before[p] for p in listeners) + 1, revoke

        t = torch.ones(4)
        dist.all_reduce(t)
        assert comm.all_reduce(np.ones(4, dtype=np.float32)).tolist() == [1.0] * 4
        comms = {r.comm for r in agent.telemetry.records()}
        assert len(comms) == 1  # the torch world and cclctl's world are both "0:0"

        dist.destroy_process_group()  # the torch front end leaves; cclctl's still runs
        assert not agent.closed
        assert len(_threads("cclctl-status")) == before["cclctl-status"] + 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        cclctl_torch.uninstrument()
        comm.close()
    assert agent.closed  # the last front end ended the services
    assert agents.current(0) is None
    for name in (*SERVICES, *listeners):
        assert len(_threads(name)) == before[name], (name, _threads(name))


@pytest.mark.timeout(60)
def test_a_torch_hang_is_named_where_cclctl_init_opened_the_revoke_end(
    store: StoreServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One revoke end per process: the one ``cclctl.init()`` opened also names the hangs
    of the torch wrapper's calls, as the live diagnosis of the job's statuses names them."""
    from cclctl.diagnose_io import hang_origin

    address = f"127.0.0.1:{store.port}"
    monkeypatch.setenv("CCLCTL_STORE", address)
    monkeypatch.setenv("CCLCTL_TOKEN", TOKEN)
    # the diagnosis names the rank the hang waits on (a job of one rank shows none itself)
    suspect = (0, "hang", "has not entered all_reduce seq 1", None, "not_entered")
    monkeypatch.setattr(hang_origin, "hang_suspect", lambda statuses, *_: suspect)
    comm = cclctl.init(
        rank=0, world_size=1, store=address, token=TOKEN, trace_dir=str(tmp_path), timeout_s=30
    )
    cclctl_torch.instrument(trace_dir=str(tmp_path), timeout_s=30)
    try:
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1
        )
        sub = dist.new_group([0])  # a torch group only (the worlds share the id "0:0")
        sess, agent = cclctl_torch.session(), agents.current(0)
        assert sess is not None and agent is not None and sess.revoke is not None
        rec = CollectiveRecord(sess.comm(sub).id, 1, "all_reduce", "float32", 4, 16)
        hooks = agent.hooks_of(rec)
        assert hooks is not None
        hooks.expired(rec, "all_reduce seq 1 has run 30.0s")  # as the agent's watchdog does

        named = sess.revoke.record
        assert named is not None
        assert (named.kind, named.origin, named.via) == ("hang", 0, "watchdog")
        assert (named.comm, named.seq, named.symptom) == (rec.comm, 1, "not_entered")
        client = StoreClient("127.0.0.1", store.port, token=TOKEN)
        try:
            job = agent.status.rdzv.job if agent.status is not None else ""
            stored = client.try_get(f"cclctl/{job}/{revocation.KEY}")
        finally:
            client.close()
        assert stored is not None and revocation.decode(stored, "test") == named
        assert agent.telemetry.revoke == named  # its statuses and dumps carry it
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        cclctl_torch.uninstrument()
        comm.close()
