"""What an operator's verbs (`cclctl abort`, `cclctl retry`) share before they write: who
the operator is, the job they act on (``--job``, else the store's only one), its token and
a connection that may write with it, its world size, and the live diagnosis that names the
ranks that do not answer.

Everything is checked before anything is written: a bad ``--wait`` or ``--stale``, a job
without a token on this host, a token the store refuses, or a job that has published no
status is exit 2 with one line, and the store is left as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import socket
from collections.abc import Iterator

from cclctl import auth
from cclctl.commands.checks import store_to_read
from cclctl.commands.store_access import connect
from cclctl.config import client_token, job_dir
from cclctl.diagnose.model import Diagnosis, Options
from cclctl.diagnose_io.live import diagnose_live
from cclctl.errors import ConfigError, StoreError, UsageError
from cclctl.live.classify import classify
from cclctl.live.snapshot import JobStatuses, fetch, job_prefix, parse
from cclctl.store.kv import KeyValueStore
from cclctl.store.scope import ScopedStore


@dataclasses.dataclass(frozen=True)
class OperatorJob:
    """The job an operator acts on: its name, its keys (with the token), its world size."""

    name: str
    scoped: ScopedStore
    world_size: int


@contextlib.contextmanager
def operator_job(
    verb: str, store: str | None, job: str | None, wait: float, stale: float
) -> Iterator[OperatorJob]:
    """The job ``verb`` acts on, connected with its token, once every check passed."""
    address = store_to_read(verb, store)
    check_waits(wait, stale)
    name = job if job is not None else only_job(address, verb)
    token = job_token(name, verb)
    with operator_connect(address, token, name, verb) as client:
        world_size = classify(parse(name, address, client.list(job_prefix(name)))).world_size
        if world_size == 0:  # a mistyped --job: write nothing into an empty namespace
            raise UsageError(f"job {name!r} has published no status to {address} yet")
        yield OperatorJob(name, ScopedStore.for_job(client, name), world_size)


def check_waits(wait: float, stale: float) -> None:
    """An operator verb's ``--wait`` (zero or more) and ``--stale`` (positive)."""
    if not wait >= 0:
        raise ConfigError(f"--wait must be zero or more, not {wait!r}", flag="--wait")
    if not stale > 0:
        raise ConfigError(f"--stale must be positive, not {stale!r}", flag="--stale")


def operator() -> str:
    """``user@host``: who acts, as every rank's error names them (no environment read)."""
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def only_job(address: str, verb: str) -> str:
    """The store's only job, read as top reads it (statuses are readable without a token)."""
    with operator_connect(address, client_token(), None, verb) as reader:
        return fetch(reader, None).job


def job_token(job: str, verb: str) -> str:
    """CCLCTL_TOKEN, else the job's token file on this host; else refused (exit 2)."""
    given = client_token()
    if given:
        return given
    folder = job_dir(job)
    found = auth.read_token_file(folder)
    if found is None:
        raise UsageError(
            f"{verb} needs the token of job {job!r} to write to its store: set CCLCTL_TOKEN, "
            f"or run it on the host whose {auth.token_path(folder)} holds it (none there); "
            "nothing was changed",
            variable="CCLCTL_TOKEN",
        )
    return found


def operator_connect(address: str, token: str | None, job: str | None, verb: str) -> KeyValueStore:
    """A connection to the store with ``token``; a token it refuses is exit 2."""
    try:
        return connect(address, token=token or "")
    except StoreError as exc:
        if exc.fields.get("reason") != "token":
            raise
        whose = f"the token of job {job!r}" if job is not None else "the job's token"
        raise UsageError(
            f"{verb} needs {whose} and the store at {address} refused this one "
            f"({exc}); nothing was changed",
            variable="CCLCTL_TOKEN",
        ) from None


def liveness_diagnosis(statuses: JobStatuses, stale_s: float) -> Diagnosis | None:
    """The live diagnosis whose liveness verdicts name the silent ranks (None: no status)."""
    if not statuses.statuses and not statuses.bad:
        return None
    # Without the records the ranks adopted: the job's record (this abort, or the failure
    # before it) would be the one verdict, and the silent ranks are named by their liveness.
    plain = {r: dataclasses.replace(s, revoke=None) for r, s in statuses.statuses.items()}
    return diagnose_live(
        dataclasses.replace(statuses, statuses=plain), None, Options(stale_after_s=stale_s)
    )
