"""The etcd store on a cluster that checks who cclctl is: etcd's own users (a password in
a file, a token renewed when etcd forgets it) and TLS with client certificates, against a
real etcd started by the test; what is missing or wrong is said in words."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd_cluster import EtcdCluster, etcd_cluster
from tls_files import make_tls_files

from cclctl.errors import ConfigError, StoreError
from cclctl.store.etcd import credentials
from cclctl.store.etcd.client import EtcdClient
from cclctl.store.etcd.credentials import Credentials

pytestmark = pytest.mark.timeout(120)
USER, PASSWORD = "job", "job-secret"


def _etcdctl(cluster: EtcdCluster, *args: str) -> None:
    if shutil.which("etcdctl") is None:
        pytest.skip("etcdctl is not installed (apt-get install etcd-client)")
    endpoint = cluster.member_address(0)
    cmd = ["etcdctl", f"--endpoints={endpoint}", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[EtcdCluster]:
    """One member with users on: root, and ``job`` with readwrite on ``cclctl/`` only."""
    with etcd_cluster(tmp_path / "etcd", 1) as cluster:
        _etcdctl(cluster, "user", "add", "root:root-secret")
        _etcdctl(cluster, "role", "add", "cclctl")
        _etcdctl(cluster, "role", "grant-permission", "cclctl", "--prefix=true", "readwrite",
                 "cclctl/")  # fmt: skip
        _etcdctl(cluster, "user", "add", f"{USER}:{PASSWORD}")
        _etcdctl(cluster, "user", "grant-role", USER, "cclctl")
        _etcdctl(cluster, "auth", "enable")
        yield cluster


def _client(cluster: EtcdCluster, creds: Credentials) -> EtcdClient:
    return EtcdClient.from_address(
        cluster.address, connect_timeout_s=10, timeout_s=10, credentials=creds
    )


def test_a_user_reads_and_writes_the_jobs_keys_and_renews_its_token(guarded) -> None:
    with _client(guarded, Credentials(USER, PASSWORD)) as client:
        client.set("cclctl/j/a", b"1")
        assert client.compare_set("cclctl/j/b", None, b"2") == b"2"
        assert client.list("cclctl/j/") == {"cclctl/j/a": b"1", "cclctl/j/b": b"2"}
        client.wait(["cclctl/j/a", "cclctl/j/b"], timeout_s=5)
        # etcd forgets the user's tokens when its password is set (here to the same one)
        subprocess.run(
            ["etcdctl", f"--endpoints={guarded.member_address(0)}", "--user=root:root-secret",
             "user", "passwd", USER, "--interactive=false"],
            input=PASSWORD + "\n", capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        assert client.get("cclctl/j/a", timeout_s=5) == b"1"  # authenticated again
        with pytest.raises(StoreError, match="needs readwrite on the prefix cclctl/"):
            client.set("elsewhere", b"x")


def test_no_user_or_a_wrong_password_is_refused_in_words(guarded) -> None:
    with (
        _client(guarded, Credentials()) as client,
        pytest.raises(
            StoreError, match="checks users: set CCLCTL_ETCD_USER and CCLCTL_ETCD_PASSWORD_FILE"
        ),
    ):
        client.set("cclctl/j/a", b"1")
    with pytest.raises(StoreError, match="invalid user ID or password \\(user 'job'"):
        _client(guarded, Credentials(USER, "wrong")).set("cclctl/j/a", b"1")


def test_a_launched_job_runs_on_a_cluster_with_users(guarded, tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, CCLCTL_STORE=guarded.address, CCLCTL_ETCD_USER=USER,
               CCLCTL_ETCD_PASSWORD_FILE=str(secret), PYTHONPATH=path)  # fmt: skip
    program = "import numpy as np, cclctl\nc = cclctl.init()\nx = np.ones(2)\nc.all_reduce(x)\n"
    program += "print('sum', x[0])\nc.close()\n"
    cmd = [sys.executable, "-m", "cclctl", "launch", "-n", "2", "--", sys.executable, "-c",
           program]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[rank 0] sum 2.0", "[rank 1] sum 2.0"]


def test_tls_with_a_client_certificate(tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path / "tls")
    with etcd_cluster(tmp_path / "etcd", 1, tls=tls) as cluster:
        creds = Credentials(ca=tls.ca, cert=tls.client_cert, key=tls.client_key)
        with _client(cluster, creds) as client:
            client.set("cclctl/j/a", b"1")
            assert client.try_get("cclctl/j/a") == b"1"
        with pytest.raises(StoreError):  # the member asks for a certificate: none given
            EtcdClient.from_address(
                cluster.address, connect_timeout_s=2, credentials=Credentials(ca=tls.ca)
            )


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({credentials.USER: "u"}, "CCLCTL_ETCD_USER and CCLCTL_ETCD_PASSWORD_FILE go together"),
        ({credentials.CERT: "c", credentials.KEY: "k"}, "set CCLCTL_ETCD_CA too"),
        ({credentials.CA: "/nonexistent/ca.pem"}, "CCLCTL_ETCD_CA=/nonexistent/ca.pem: no such"),
        ({credentials.USER: "u", credentials.PASSWORD_FILE: "/nonexistent"}, "No such file"),
    ],
)
def test_incomplete_or_unreadable_settings_are_said_in_words(env, words) -> None:
    with pytest.raises(ConfigError, match=words):
        credentials.from_env(env)


def test_a_password_file_is_read_without_its_line_break(tmp_path: Path) -> None:
    secret = tmp_path / "p"
    secret.write_text("s3cret\n")
    env = {credentials.USER: "u", credentials.PASSWORD_FILE: str(secret)}
    assert credentials.from_env(env) == Credentials("u", "s3cret")
    secret.write_text("")
    with pytest.raises(ConfigError, match="the file is empty"):
        credentials.from_env(env)
