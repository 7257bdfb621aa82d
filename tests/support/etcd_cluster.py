"""A real etcd cluster for the tests: members on free loopback ports in a temporary folder,
started by the test and killed by their pids (Debian's ``etcd-server``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from ports import free_port_block
from tls_files import TlsFiles

#: How long a cluster may take to elect a leader and answer on every member.
START_S = 30.0


def etcd_binary() -> str:
    """The ``etcd`` server; the test skips (with its reason) where it is not installed."""
    path = shutil.which("etcd")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install etcd (apt-get install etcd-server); see scripts/test")
        pytest.skip("the etcd binary is not installed (apt-get install etcd-server)")
    return path


class EtcdCluster:
    """``size`` members on loopback; ``address`` is what ``CCLCTL_STORE`` takes."""

    def __init__(
        self, folder: Path, size: int, extra: Sequence[str] = (), tls: TlsFiles | None = None
    ) -> None:
        """``extra``: more flags for every member; ``tls``: members serve clients over TLS
        with these files, and ask for a client certificate the CA signed."""
        binary = etcd_binary()
        self.tls = tls
        scheme = "https" if tls else "http"
        secure = [] if tls is None else [
            f"--cert-file={tls.server_cert}", f"--key-file={tls.server_key}",
            f"--trusted-ca-file={tls.ca}", "--client-cert-auth",
        ]  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        base = free_port_block(2 * size)
        self.client_ports = [base + 2 * i for i in range(size)]
        peers = [base + 2 * i + 1 for i in range(size)]
        initial = ",".join(f"m{i}=http://127.0.0.1:{peers[i]}" for i in range(size))
        token = f"cclctl-test-{base}"
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            for i in range(size):
                log = open(folder / f"m{i}.log", "wb")  # noqa: SIM115 - the child keeps it
                self.procs.append(
                    subprocess.Popen(
                        [
                            binary,
                            f"--name=m{i}",
                            f"--data-dir={folder / f'm{i}.etcd'}",
                            f"--listen-client-urls={scheme}://127.0.0.1:{self.client_ports[i]}",
                            f"--advertise-client-urls={scheme}://127.0.0.1:{self.client_ports[i]}",
                            f"--listen-peer-urls=http://127.0.0.1:{peers[i]}",
                            f"--initial-advertise-peer-urls=http://127.0.0.1:{peers[i]}",
                            f"--initial-cluster={initial}",
                            f"--initial-cluster-token={token}",
                            "--initial-cluster-state=new",
                            *secure,
                            *extra,
                        ],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
                log.close()
            self._until_healthy()
        except BaseException:
            self.stop()
            raise

    @property
    def address(self) -> str:
        return "etcd://" + ",".join(f"127.0.0.1:{port}" for port in self.client_ports)

    def member_address(self, i: int) -> str:
        return f"127.0.0.1:{self.client_ports[i]}"

    def _until_healthy(self) -> None:
        deadline = time.monotonic() + START_S
        for i, port in enumerate(self.client_ports):
            while not _healthy(port, self.tls):
                if self.procs[i].poll() is not None:
                    raise RuntimeError(f"etcd member m{i} exited with {self.procs[i].returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcd member m{i} not healthy after {START_S:g}s")
                time.sleep(0.05)

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` (by its pid) and reap it."""
        proc = self.procs[i]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def pause(self, i: int) -> None:
        """SIGSTOP member ``i``: its sockets stay open and it answers nothing, as a member
        cut off by the network does (``stop`` kills it all the same)."""
        os.kill(self.procs[i].pid, signal.SIGSTOP)

    def stop(self) -> None:
        """Kill every member still running, by pid, and reap it."""
        for i in range(len(self.procs)):
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self.kill(i)


def _healthy(port: int, tls: TlsFiles | None = None) -> bool:
    context = None if tls is None else tls.client_context()
    scheme = "http" if tls is None else "https"
    try:
        url = f"{scheme}://127.0.0.1:{port}/health"
        with urllib.request.urlopen(url, timeout=1, context=context) as resp:
            return bool(json.load(resp).get("health") == "true")
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def etcd_cluster(
    folder: Path, size: int, extra: Sequence[str] = (), tls: TlsFiles | None = None
) -> Iterator[EtcdCluster]:
    """A running cluster of ``size`` members, killed on the way out."""
    cluster = EtcdCluster(folder, size, extra, tls)
    try:
        yield cluster
    finally:
        cluster.stop()


def watchers(port: int) -> int:
    """How many watches member ``port`` holds now (its ``/metrics``), so a test waits for a
    blocked read to be in place instead of sleeping."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("etcd_debugging_mvcc_watcher_total "):
                return int(float(line.split()[1]))
    return 0


def until_watching(port: int, count: int = 1, within_s: float = 10) -> None:
    """Return once member ``port`` holds ``count`` watches; fail after ``within_s``."""
    deadline = time.monotonic() + within_s
    while watchers(port) < count:
        assert time.monotonic() < deadline, f"fewer than {count} watches on {port}"
        time.sleep(0.01)
