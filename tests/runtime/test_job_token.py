"""How a rank gets the job's token: given, made by rank 0, read from the job's folder, or a
one-line refusal; and how a stale token file is read again until the ranks agree."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from launch_helpers import Lines
from ports import free_port
from processes import gone, until

from cclctl import auth
from cclctl.config import RuntimeConfig, job_dir, runtime_from_env
from cclctl.errors import ConfigError, RendezvousError
from cclctl.launch.launcher import launch
from cclctl.runtime.job import token as job_token
from cclctl.runtime.job.token import TokenSource, agree_token, publish_check, resolve_token
from cclctl.store import pidfile
from cclctl.store.client import StoreClient, StoreServer
from cclctl.store.scope import ScopedStore
from scripts import script

WORKER = script("link_auth_worker.py")
NOT_HERE = "192.0.2.1"  # TEST-NET-1: never an address of this host


def _cfg(tmp_path: Path, **kw: object) -> RuntimeConfig:
    base = RuntimeConfig(job="tok", connect_timeout_s=5.0, trace_dir=str(tmp_path))
    return base.replace(**kw)


@pytest.mark.parametrize(
    ("given", "hosts", "local", "running", "plan"),
    [
        (True, True, True, False, job_token.GIVEN),
        (True, False, False, True, job_token.GIVEN),
        (False, True, True, False, job_token.GENERATE),
        (False, False, True, False, job_token.WAIT_FOR_FILE),
        (False, False, True, True, job_token.READ_FILE),
        (False, False, False, False, job_token.REFUSE),
        (False, False, False, True, job_token.REFUSE),
    ],
)
def test_token_plan(given: bool, hosts: bool, local: bool, running: bool, plan: str) -> None:
    got = job_token.token_plan(
        given=given, hosts_store=hosts, store_is_local=local, store_running=running
    )
    assert got == plan


def test_rank0_hosting_the_store_makes_a_token_and_writes_it_0600(tmp_path: Path) -> None:
    source = resolve_token(
        _cfg(tmp_path), rank=0, store=("127.0.0.1", 1), hosts_store=True, store_running=False
    )
    path = auth.token_path(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() == source.token and len(source.token) >= 32


def test_a_rank_on_rank0s_host_waits_for_the_token_file(tmp_path: Path) -> None:
    token = auth.new_token()
    writer = threading.Timer(0.3, auth.write_token_file, (tmp_path, token))
    writer.start()
    source = resolve_token(
        _cfg(tmp_path), rank=1, store=("127.0.0.1", 1), hosts_store=False, store_running=False
    )
    writer.join()
    assert (source.token, source.plan) == (token, job_token.WAIT_FOR_FILE)


def test_a_given_token_wins(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, token="from-the-environment")
    source = resolve_token(cfg, rank=3, store=(NOT_HERE, 1), hosts_store=False, store_running=True)
    assert source.token == "from-the-environment"
    assert not auth.token_path(tmp_path).exists()


def test_a_rank_on_another_host_without_a_token_fails_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_token(
            _cfg(tmp_path), rank=1, store=(NOT_HERE, 29500), hosts_store=False, store_running=False
        )
    message = str(err.value)
    assert "\n" not in message
    assert "no CCLCTL_TOKEN" in message and f"{NOT_HERE}:29500" in message
    assert job_token.RECIPE in message


def test_the_cli_refuses_a_remote_rank_without_a_token_with_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCLCTL_", "SLURM_", "OMPI_"))}
    env.update(
        RANK="1", WORLD_SIZE="2", MASTER_ADDR=NOT_HERE, MASTER_PORT="29500",
        CCLCTL_TRACE_DIR=str(tmp_path), PYTHONPATH=os.getcwd(),
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "cclctl", "bench", "-e", "8", "-n", "1", "-w", "0"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CCLCTL_TOKEN" in lines[0] and "token_urlsafe" in lines[0]


def test_a_stale_token_file_is_read_again_until_it_matches_rank0s(tmp_path: Path) -> None:
    """Rank 1 read an earlier run's token; rank 0's new one lands in the file later."""
    old, new = auth.new_token(), auth.new_token()
    auth.write_token_file(tmp_path, old)
    with StoreServer("127.0.0.1", 0).start() as server:
        client = StoreClient("127.0.0.1", server.port, connect_timeout_s=5.0)
        scoped = ScopedStore.for_job(client, "tok")
        publish_check(scoped, new, "tok")
        source = TokenSource(old, job_token.WAIT_FOR_FILE, str(tmp_path))
        writer = threading.Timer(0.3, auth.write_token_file, (tmp_path, new))
        writer.start()
        assert agree_token(scoped, source, 1, "tok", 5.0) == new
        writer.join()
        client.close()


def test_a_given_token_that_is_not_rank0s_is_refused_at_once(tmp_path: Path) -> None:
    with StoreServer("127.0.0.1", 0).start() as server:
        client = StoreClient("127.0.0.1", server.port, connect_timeout_s=5.0)
        scoped = ScopedStore.for_job(client, "tok")
        publish_check(scoped, auth.new_token(), "tok")
        mine = auth.new_token()
        with pytest.raises(RendezvousError, match="is not rank 0's") as err:
            agree_token(scoped, TokenSource(mine, job_token.GIVEN, ""), 1, "tok", 30.0)
        assert mine not in str(err.value) and auth.redact(mine) in str(err.value)
        client.close()


def test_job_dir_is_the_trace_dir_else_a_folder_under_tmpdir() -> None:
    assert job_dir("j", {"CCLCTL_TRACE_DIR": "/dumps", "TMPDIR": "/t"}) == "/dumps"
    assert job_dir("j", {"TMPDIR": "/t"}) == f"/t/cclctl-{os.getuid()}/j"
    assert job_dir("../x y", {}) == f"/tmp/cclctl-{os.getuid()}/_x_y"


def test_the_default_job_folder_never_shadows_the_package(tmp_path: Path) -> None:
    """A folder named ``cclctl`` in the working directory would be imported instead of an
    editable install's package by ``python -m cclctl...`` run there."""
    folder = Path(job_dir("j", {"TMPDIR": str(tmp_path)}))
    folder.mkdir(parents=True)
    found = subprocess.run(
        [sys.executable, "-c", "import cclctl; print(cclctl.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert found.stdout.strip().endswith("__init__.py")
    assert not folder.parent.name.isidentifier()


def test_link_mac_is_validated() -> None:
    assert runtime_from_env({"CCLCTL_LINK_MAC": "1"}).link_mac is True
    assert runtime_from_env({}).link_mac is False
    with pytest.raises(ConfigError, match="CCLCTL_LINK_MAC='maybe' is not valid"):
        runtime_from_env({"CCLCTL_LINK_MAC": "maybe"})


@pytest.mark.parametrize("mac", ["0", "1"])
def test_ranks_started_like_torchrun_without_a_token_share_rank0s(tmp_path: Path, mac: str) -> None:
    """No CCLCTL_TOKEN: rank 0 makes one and writes the file; rank 1 reads it; they link."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    env.update(
        WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
        CCLCTL_TRACE_DIR=str(tmp_path), CCLCTL_TRANSPORT="tcp", CCLCTL_JOB="torchrun-like",
        CCLCTL_LINK_MAC=mac, PYTHONPATH=os.getcwd(), CCLCTL_STORE_LINGER="1",
    )  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER],
            env=dict(env, RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (1, 0)  # rank 1 first: it waits for the file rank 0 writes
    ]
    try:
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    for out, _ in outs:
        assert json.loads(out)["results"] == [[3.0] * 4] * 5
    # The file rank 0 made goes with the store that needed it (before its pid file goes).
    for found in tmp_path.glob("store-*.pid"):
        store = pidfile.read(str(found))
        if store is not None:
            until("the store's exit", lambda pid=store["pid"]: gone(pid), 60)
    assert not auth.token_path(tmp_path).exists()


def test_launch_hands_the_token_in_the_environment_writes_it_0600_and_never_prints_it(
    tmp_path: Path,
) -> None:
    program = (
        "import os, stat, json\n"
        "from cclctl import auth\n"
        "path = auth.token_path(os.environ['CCLCTL_TRACE_DIR'])\n"
        "print(json.dumps({'same': path.read_text().strip() == os.environ['CCLCTL_TOKEN'],"
        " 'mode': stat.S_IMODE(path.stat().st_mode)}))\n"
    )
    lines = Lines()
    result = launch(
        [sys.executable, "-c", program], 2, env={"CCLCTL_TRACE_DIR": str(tmp_path)}, output=lines
    )
    assert result.returncode == 0, lines.items
    reports = [json.loads(line) for _, stream, line in lines.items if stream == "stdout"]
    assert reports == [{"same": True, "mode": 0o600}] * 2
    assert not auth.token_path(tmp_path).exists()  # removed when the job ends


def test_cclctl_launch_never_prints_the_token_whole(tmp_path: Path) -> None:
    env = dict(os.environ, CCLCTL_TRACE_DIR=str(tmp_path), PYTHONPATH=os.getcwd())
    program = "import os; print(os.environ['CCLCTL_TOKEN'][:4], len(os.environ['CCLCTL_TOKEN']))"
    proc = subprocess.run(
        [sys.executable, "-m", "cclctl", "launch", "-n", "1", "--", sys.executable, "-c", program],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    prefix, length = proc.stdout.split("]", 1)[1].split()
    assert int(length) >= 32
    whole = [w for w in (proc.stdout + proc.stderr).split() if len(w) >= 32 and w[:4] == prefix]
    assert whole == []
