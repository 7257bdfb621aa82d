"""The host's first local rank starts its host's agent (:mod:`.main`) and waits for its word.

The agent answers once bound: its pid, or that another agent of the job already serves the
host (a second start, a rerun on the same host while the first agent lingers). A start that
fails is logged and returns None: the ranks then publish their own statuses, as without an
agent; the job never fails for its agent.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import subprocess
import sys
from pathlib import Path

from cclctl.config import inherited_environment

#: how long the starting rank waits for the agent's answer
START_TIMEOUT_S = 10.0
LOG_NAME = "agent.log"

log = logging.getLogger("cclctl.hostagent")
#: The agents this process saw serve their host, by (job, store, token, host): the
#: rendezvous starts the host's agent, and the status link, which would start it again,
#: finds it here instead of in a second agent process that answers "elsewhere".
_SERVING: set[tuple[str, str, str, str]] = set()


def start_agent(
    *, job: str, store: str, token: str, host: str, interval_s: float, folder: str,
    linger_s: float | None = None, first_s: float = 30.0, metrics: tuple[str, int] = ("", 0),
) -> int | None:  # fmt: skip
    """Start ``host``'s agent for ``job`` (store at ``store``; its Prometheus endpoint at
    ``metrics``, none at port 0); its pid, or None when another agent already serves the
    host (one this process started or found before is not looked for again) or it could
    not start (logged)."""
    serving = (job, store, token, host)
    if serving in _SERVING:
        return None
    linger = max(2.0, 2 * interval_s) if linger_s is None else linger_s
    spec = {
        "job": job,
        "store": store,
        "token": token,
        "host": host,
        "interval_s": interval_s,
        "linger_s": linger,
        "first_s": first_s,
        "log": os.path.join(folder, LOG_NAME),
        "metrics_addr": metrics[0],
        "metrics_port": metrics[1],
    }
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cclctl.runtime.hostagent.main"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True, env=_environment(),
        )  # fmt: skip
    except OSError as exc:
        log.warning("cclctl: cannot start the host agent: %s", exc)
        return None
    assert proc.stdin is not None and proc.stdout is not None
    try:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(json.dumps(spec).encode() + b"\n")
            proc.stdin.close()
        ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
        line = proc.stdout.readline(4096) if ready else b""
    finally:
        proc.stdout.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(START_TIMEOUT_S)  # the first process exits as the agent forks off
    try:
        answer = json.loads(line)
    except ValueError:
        answer = {"error": "it did not answer in time" if not ready else "it ended at once"}
    if not isinstance(answer, dict):
        answer = {"error": "it answered something else"}
    if "pid" in answer and isinstance(answer["pid"], int):
        _SERVING.add(serving)
        return int(answer["pid"])
    if answer.get("elsewhere"):
        _SERVING.add(serving)
    else:
        where = os.path.join(folder, LOG_NAME)
        log.warning("cclctl: no host agent on %s (%s; see %s); ranks publish their own "
                    "statuses", host, answer.get("error"), where)  # fmt: skip
    return None


def _environment() -> dict[str, str]:
    """This rank's environment, with the folder it imported cclctl from first on the path."""
    env = inherited_environment()
    root = str(Path(__file__).resolve().parents[3])  # holds cclctl/runtime/hostagent/ (this)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    env["PYTHONPATH"] = os.pathsep.join([root, *rest])
    return env
