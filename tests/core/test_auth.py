"""The job's secret: proofs bind their whole context, files stay private."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest

from cclctl import auth
from cclctl.errors import ConfigError


def test_a_proof_verifies_only_under_the_same_token_and_context() -> None:
    token, other = auth.new_token(), auth.new_token()
    n1, n2 = auth.nonce(), auth.nonce()
    proof = auth.prove(token, "link", "job", 0, 1, n1, n2)
    assert len(proof) == auth.PROOF_BYTES
    assert auth.verify(token, proof, "link", "job", 0, 1, n1, n2)
    assert not auth.verify(other, proof, "link", "job", 0, 1, n1, n2)
    assert not auth.verify(token, proof, "link", "job", 1, 0, n1, n2)  # roles swapped
    assert not auth.verify(token, proof, "link", "job", 0, 1, n2, n1)
    assert not auth.verify(token, proof, "store", "job", 0, 1, n1, n2)


def test_parts_are_length_prefixed() -> None:
    token = auth.new_token()
    assert auth.prove(token, "ab", "c") != auth.prove(token, "a", "bc")


def test_tokens_and_nonces_are_fresh() -> None:
    assert len({auth.new_token() for _ in range(100)}) == 100
    assert len({auth.nonce() for _ in range(100)}) == 100


def test_logs_show_a_redacted_token() -> None:
    token = auth.new_token()
    shown = auth.redact(token)
    assert shown.startswith(token[:4]) and token not in shown
    assert auth.redact("") == "(none)"


def test_the_token_file_is_the_owners_alone(tmp_path: Path) -> None:
    folder = tmp_path / "cclctl" / "job"
    token = auth.new_token()
    path = auth.write_token_file(folder, token)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert auth.read_token_file(folder) == token
    assert auth.read_token_file(tmp_path / "nowhere") is None
    assert [p.name for p in folder.iterdir()] == [auth.TOKEN_FILE]  # no temp file left


def test_writers_at_once_in_one_process_each_write_a_whole_token(tmp_path: Path) -> None:
    """Two launches in one process write into one folder at the same moment: neither
    renames the other's temporary file away (each write completes), and the file holds
    one of their tokens whole."""
    tokens = [auth.new_token() for _ in range(8)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(tokens))

    def write(token: str) -> None:
        start.wait()
        try:
            for _ in range(50):
                auth.write_token_file(tmp_path, token)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(t,)) for t in tokens]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert auth.read_token_file(tmp_path) in tokens
    assert [p.name for p in tmp_path.iterdir()] == [auth.TOKEN_FILE]  # no temp file left


def test_a_token_file_others_may_write_is_refused(tmp_path: Path) -> None:
    path = auth.write_token_file(tmp_path, auth.new_token())
    path.chmod(0o622)
    with pytest.raises(ConfigError, match="is not this user's alone"):
        auth.read_token_file(tmp_path)


def test_a_token_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = auth.write_token_file(tmp_path / "elsewhere", auth.new_token())
    (tmp_path / "job").mkdir()
    auth.token_path(tmp_path / "job").symlink_to(real)
    with pytest.raises(ConfigError, match="cannot read the token file"):
        auth.read_token_file(tmp_path / "job")
