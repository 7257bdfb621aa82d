"""Finding a job is not manual: `cclctl launch` (and `cclctl run`, where it can) prints the
store and the commands to paste, `--store` defaults to CCLCTL_STORE, and the shell
completes cclctl's commands and options."""

from __future__ import annotations

import json
import os
import queue
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

PY = sys.executable

WORKER = """
import os, sys, time
import numpy as np
import cclctl

comm = cclctl.init()
try:
    comm.all_reduce(np.ones(16, dtype=np.float32))
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        time.sleep(0.05)
finally:
    comm.close()
"""


def clean_env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    return {**base, **extra}


def cclctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "cclctl", *args],
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def pasted(line: str, *more: str) -> subprocess.CompletedProcess[str]:
    """Run a printed ``cclctl ...`` line as a user pastes it (with ``more`` arguments)."""
    words = shlex.split(line)
    assert words[0] == "cclctl", line
    return cclctl(*words[1:], *more)


def follow(stream: IO[str], lines: queue.Queue[str]) -> threading.Thread:
    def pump() -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def next_line(lines: queue.Queue[str], deadline: float, seen: list[str]) -> str:
    try:
        line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        raise AssertionError("no line in time; so far: " + "\n".join(seen)) from None
    seen.append(line)
    return line


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_launch_prints_the_store_and_commands_that_work_against_the_job(tmp_path: Path) -> None:
    release = tmp_path / "release"
    proc = subprocess.Popen(
        [PY, "-m", "cclctl", "launch", "-n", "2", "--", PY, "-c", WORKER, str(release)],
        env=clean_env(CCLCTL_JOB="find-me", CCLCTL_STATUS_INTERVAL="0.2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    err: queue.Queue[str] = queue.Queue()
    out: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None and proc.stderr is not None
    follow(proc.stderr, err)
    follow(proc.stdout, out)
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        head = next_line(err, deadline, seen)
        top_line = next_line(err, deadline, seen).strip()
        hang_line = next_line(err, deadline, seen).strip()
        assert head.startswith("cclctl: job find-me store 127.0.0.1:"), head
        store = head.split(" store ")[1].split(";")[0]
        assert top_line == f"cclctl top --store {store} --job find-me"
        assert hang_line == f"cclctl diagnose hang --store {store} --job find-me"
        ready = sorted(next_line(out, deadline, seen) for _ in range(2))
        assert ready == ["[rank 0] ready", "[rank 1] ready"]
        while True:  # each rank's first status is a publisher turn after init: poll for both
            doc = json.loads(pasted(top_line, "--json").stdout)
            states = [rank["state"] for rank in doc["ranks"]]
            if states == ["ok", "ok"] or time.monotonic() > deadline:
                break
        assert (doc["job"], states) == ("find-me", ["ok", "ok"]), doc
        shown = pasted(top_line, "--once")
        assert shown.returncode == 0, shown.stderr
        assert "find-me" in shown.stdout
        assert all(str(rank["pid"]) in shown.stdout for rank in doc["ranks"]), shown.stdout
        verdict = pasted(hang_line, "--json")
        assert verdict.returncode == 0, verdict.stdout + verdict.stderr
        assert json.loads(verdict.stdout)["fault"] is False
        from_env = cclctl("top", "--json", env=clean_env(CCLCTL_STORE=store))
        assert from_env.returncode == 0, from_env.stderr
        doc = json.loads(from_env.stdout)
        assert (doc["job"], doc["ranks_seen"]) == ("find-me", 2)
        diag_env = cclctl("diagnose", "hang", "--json", env=clean_env(CCLCTL_STORE=store))
        assert diag_env.returncode == 0 and json.loads(diag_env.stdout)["fault"] is False
    finally:
        release.touch()
        try:
            proc.wait(60)
        finally:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0


def test_run_prints_where_to_watch_when_it_knows_the_store(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    env = clean_env(MASTER_ADDR="node7", MASTER_PORT="29500", CCLCTL_JOB="train1")
    done = cclctl("run", "--", "touch", str(marker), env=env)
    assert done.returncode == 0 and marker.exists()
    assert done.stderr.splitlines()[1:] == [
        "  cclctl top --store node7:29501 --job train1",
        "  cclctl diagnose hang --store node7:29501 --job train1",
    ]
    env = clean_env(CCLCTL_STORE="10.0.0.1:4000", RANK="0", WORLD_SIZE="2")
    done = cclctl("run", "--job", "j", "--", "touch", str(marker), env=env)
    assert "  cclctl top --store 10.0.0.1:4000 --job j" in done.stderr.splitlines()
    done = cclctl("run", "--", "touch", str(marker), env={**env, "RANK": "1"})
    assert done.returncode == 0 and done.stderr == ""  # rank 0 says it, once per job
    done = cclctl("run", "--", "touch", str(marker))
    assert done.returncode == 0 and done.stderr == ""  # no store known: nothing to say


@pytest.mark.parametrize("command", [["top", "--once"], ["diagnose", "hang"]])
def test_no_store_anywhere_is_a_usage_error_that_says_what_to_give(
    command: list[str], tmp_path: Path
) -> None:
    done = cclctl(*command, env=clean_env(TMPDIR=str(tmp_path)))  # and no job's dumps here
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1
    assert "--store HOST:PORT" in done.stderr and "CCLCTL_STORE" in done.stderr


@pytest.mark.parametrize("command", [["top"], ["diagnose", "hang"], ["launch"], ["run"]])
def test_help_names_the_store_defaults_and_the_printed_commands(command: list[str]) -> None:
    done = subprocess.run(
        [PY, "-m", "cclctl", *command, "--help"],
        env=clean_env(COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    needle = "cclctl top" if command[0] in ("launch", "run") else "CCLCTL_STORE"
    assert needle in text, text


@pytest.mark.timeout(60)
def test_bash_completion_completes_commands_and_options(tmp_path: Path) -> None:
    exe = tmp_path / "cclctl"
    exe.write_text(f'#!/bin/sh\nexec {shlex.quote(PY)} -m cclctl "$@"\n')
    exe.chmod(0o755)
    env = clean_env(PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    script = subprocess.run(
        ["bash", "-c", "cclctl --show-completion"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert script.returncode == 0, script.stderr
    assert "complete -o default -F _cclctl_completion cclctl" in script.stdout
    probe = (
        'eval "$(cclctl --show-completion)"\n'
        "COMP_WORDS=(cclctl diag); COMP_CWORD=1; _cclctl_completion cclctl\n"
        'echo "${COMPREPLY[*]}"\n'
        "COMP_WORDS=(cclctl launch --gr); COMP_CWORD=2; _cclctl_completion cclctl\n"
        'echo "${COMPREPLY[*]}"\n'
    )
    done = subprocess.run(
        ["bash", "-c", probe], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.stdout.splitlines() == ["diagnose", "--grace"], done.stderr


def test_install_completion_writes_a_script_the_shell_sources(tmp_path: Path) -> None:
    env = clean_env(HOME=str(tmp_path), SHELL="/bin/bash")
    done = subprocess.run(
        ["bash", "-c", f"{shlex.quote(PY)} -m cclctl --install-completion"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    installed = tmp_path / ".bash_completions" / "cclctl.sh"
    assert "_cclctl_completion" in installed.read_text()
    assert str(installed) in (tmp_path / ".bashrc").read_text()


def test_the_app_otherwise_behaves_as_before() -> None:
    bare = cclctl()
    assert bare.returncode == 2 and "Usage: cclctl" in bare.stdout + bare.stderr
    version = cclctl("--version")
    assert version.returncode == 0 and version.stdout.startswith("cclctl ")
    unknown = cclctl("frobnicate")
    assert unknown.returncode == 2
