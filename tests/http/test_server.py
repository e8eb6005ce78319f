"""`tiered-recall http` as an operator starts it: loopback by default, a bearer token required beyond loopback (made
once, printed once, kept 0600 and used again), tokens files with scopes, and refusals that name the flag to fix."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import httpx
import pytest

from http_helpers import free_port
from tiered_recall.errors import InvalidInput
from tiered_recall.http import HttpSettings, TokenScope
from tiered_recall.http.tokens import given_tokens, kept_token, read_tokens_file

CLI = [sys.executable, "-c", "from tiered_recall.cli import main; main()"]


def test_settings_refuse_to_serve_beyond_loopback_without_a_token():
    for host in ("0.0.0.0", "::", "192.168.1.20", "example.com"):
        with pytest.raises(InvalidInput, match="--host .* lets other machines in"):
            HttpSettings(host=host)
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert not HttpSettings(host=host).needs_token
    with pytest.raises(InvalidInput, match="at least 16"):
        HttpSettings(tokens={"short": TokenScope()})
    assert HttpSettings(host="0.0.0.0", tokens={"t" * 16: TokenScope()}).host_check is None


def test_a_token_is_made_once_kept_0600_and_used_again(tmp_path):
    assert given_tokens(host="0.0.0.0", token=None, token_file=None, scope=None) is None  # none given: the kept one
    assert given_tokens(host="127.0.0.1", token=None, token_file=None, scope=None) == {}  # loopback: none asked for
    tokens, line = kept_token(host="0.0.0.0", scope=None, keep_in=tmp_path)
    (token, scope), = tokens.items()
    kept = tmp_path / "http-token"
    assert token in line and stat.S_IMODE(kept.stat().st_mode) == 0o600 and scope == TokenScope()
    again, line = kept_token(host="0.0.0.0", scope="users/alice", keep_in=tmp_path)
    assert again == {token: TokenScope("users/alice")} and token not in line and str(kept) in line
    kept.chmod(0o644)
    with pytest.raises(InvalidInput, match="chmod 600"):
        kept_token(host="0.0.0.0", scope=None, keep_in=tmp_path)


def test_a_tokens_file_gives_each_token_its_scope(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("# token  scope\nadmin-0123456789abcdef\nalice-0123456789abcdef users/alice\n"
                    'bob-0123456789abcdefgh ["users", "bob"]\n\nall-0123456789abcdefgh *\n')
    path.chmod(0o600)
    assert read_tokens_file(path) == {"admin-0123456789abcdef": TokenScope(None),
                                      "alice-0123456789abcdef": TokenScope("users/alice"),
                                      "bob-0123456789abcdefgh": TokenScope("users/bob"),
                                      "all-0123456789abcdefgh": TokenScope(None)}
    path.chmod(0o640)
    with pytest.raises(InvalidInput, match="chmod 600"):
        read_tokens_file(path)
    path.chmod(0o600)
    path.write_text("dup-0123456789abcdef\ndup-0123456789abcdef a\n")
    with pytest.raises(InvalidInput, match="line 2: this token is listed twice"):
        read_tokens_file(path)
    path.write_text('t-0123456789abcdefgh ["users", ""]\n')
    with pytest.raises(InvalidInput, match="line 1"):
        read_tokens_file(path)
    with pytest.raises(InvalidInput, match="--token or --token-file, not both"):
        given_tokens(host="127.0.0.1", token="x" * 20, token_file=path, scope=None)
    assert given_tokens(host="0.0.0.0", token="x" * 20, token_file=None, scope='["users", "bob"]') == {
        "x" * 20: TokenScope("users/bob")}


def _start(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(CLI + ["http", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_until_up(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the server did not start: {proc.communicate()[1]}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()[1]


@pytest.mark.slow
def test_the_command_beyond_loopback_prints_its_token_once_and_takes_only_it(tmp_path, stop_sidecar_after):
    store = tmp_path / "store"
    stop_sidecar_after(store)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for run in range(2):
        port = free_port()
        proc = _start(["--store", str(store), "--host", "0.0.0.0", "--port", str(port), "--device", "none",
                       "--embedder", "wordllama"], env)
        url = f"http://127.0.0.1:{port}"
        _wait_until_up(url, proc)
        token = (store / "http-token").read_text().strip()
        assert httpx.get(f"{url}/v1/count").status_code == 401
        headers = {"Authorization": f"Bearer {token}"}
        added = httpx.post(f"{url}/v1/memories", json={"memories": [{"text": f"run {run}"}]}, headers=headers)
        assert added.status_code == 200, added.text
        assert httpx.get(f"{url}/v1/count", headers=headers).json() == {"count": run + 1}
        said = _stop(proc)
        assert (token in said) == (run == 0), said  # printed the first time only
    assert stat.S_IMODE((store / "http-token").stat().st_mode) == 0o600


def test_the_command_refuses_what_it_cannot_serve(tmp_path, stop_sidecar_after):
    store = tmp_path / "store"
    stop_sidecar_after(store)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    short = subprocess.run(CLI + ["http", "--store", str(store), "--token", "short", "--device", "none",
                                  "--embedder", "wordllama"], capture_output=True, text=True, env=env, timeout=120)
    assert short.returncode == 2 and "at least 16" in short.stderr
    scope_alone = subprocess.run(CLI + ["http", "--store", str(store), "--scope", "users/alice", "--device", "none",
                                        "--embedder", "wordllama"], capture_output=True, text=True, env=env,
                                 timeout=120)
    assert scope_alone.returncode == 2 and "give the token with --token" in scope_alone.stderr
