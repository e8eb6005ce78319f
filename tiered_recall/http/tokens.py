"""Bearer tokens for `tiered-recall http`: one given on the command line (with an optional --scope), a tokens file of
token and namespace prefix per line, or, for a server bound beyond loopback with neither, one generated once, kept
with mode 0600 in the store folder (or the user's config folder) and used again on later starts."""
from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path
from typing import Optional

from ..errors import InvalidInput
from .settings import TokenScope, is_loopback

GENERATED_TOKEN_FILE = "http-token"


def read_tokens_file(path: Path) -> dict[str, TokenScope]:
    """Tokens from a file: one per line, `TOKEN` (the whole store) or `TOKEN PREFIX`, the prefix a namespace name
    ("users/alice") or a JSON list of labels (["users", "alice"]); blank lines and lines starting with # are skipped.
    The file must be readable by its owner only (like an SSH key)."""
    path = Path(path).expanduser()
    try:
        mode = path.stat().st_mode
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise InvalidInput(f"--token-file {path}: {error.strerror or error}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidInput(f"--token-file {path} may be read by other users: chmod 600 {path}")
    tokens: dict[str, TokenScope] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        token, _, rest = line.partition(" ")
        rest = rest.strip()
        if token in tokens:
            raise InvalidInput(f"--token-file {path}, line {number}: this token is listed twice")
        try:
            prefix = json.loads(rest) if rest.startswith("[") else (rest or None)
            tokens[token] = TokenScope.of(prefix)
        except (ValueError, InvalidInput) as error:
            raise InvalidInput(f"--token-file {path}, line {number}: the scope must be a namespace name "
                               f"(users/alice) or a JSON list of labels ([\"users\", \"alice\"]): {error}") from None
    if not tokens:
        raise InvalidInput(f"--token-file {path} lists no token: write one per line, TOKEN or TOKEN PREFIX")
    return tokens


def generated_token(folder: Path) -> tuple[str, Path, bool]:
    """The token kept in folder/http-token, made (mode 0600) when missing: (token, file, whether it is new)."""
    path = Path(folder) / GENERATED_TOKEN_FILE
    try:
        token = path.read_text(encoding="ascii").strip()
        if token:
            if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise InvalidInput(f"{path} may be read by other users: chmod 600 {path}, or delete it for a new "
                                   "token")
            return token, path, False
    except FileNotFoundError:
        pass
    except OSError as error:
        raise InvalidInput(f"cannot read the server's token in {path}: {error.strerror or error}") from None
    token = secrets.token_urlsafe(32)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another server of the store made it meanwhile: use that one
        return generated_token(folder)
    except OSError as error:
        raise InvalidInput(f"cannot keep the server's token in {path}: {error.strerror or error}; give one with "
                           "--token or --token-file") from None
    with os.fdopen(descriptor, "w", encoding="ascii") as out:
        out.write(token + "\n")
    return token, path, True


def given_tokens(*, host: str, token: Optional[str], token_file: Optional[Path],
                 scope: Optional[str]) -> Optional[dict[str, TokenScope]]:
    """The tokens the command line gives (--token with its --scope, or --token-file): {} for none on loopback (no
    token asked for), None for none beyond loopback (the kept token is then used: kept_token)."""
    if token is not None and token_file is not None:
        raise InvalidInput("give --token or --token-file, not both (a tokens file may list several tokens)")
    if scope is not None and token_file is not None:
        raise InvalidInput("--scope limits --token; in a tokens file, write each token's scope after it on its line")
    if scope is not None and token is None and is_loopback(host):
        raise InvalidInput("--scope limits a token: give the token with --token (or list scopes in --token-file)")
    if token_file is not None:
        return read_tokens_file(token_file)
    if token is not None:
        return {token: TokenScope.of(_scope_value(scope))}
    return {} if is_loopback(host) else None


def kept_token(*, host: str, scope: Optional[str], keep_in: Path) -> tuple[dict[str, TokenScope], str]:
    """The token kept in `keep_in` (made on the first start) for a server beyond loopback given none, and a line to
    print: the token itself when it is new (shown this once), else where it is kept."""
    kept, path, new = generated_token(keep_in)
    if new:
        line = (f"tiered-recall http: --host {host} lets other machines in, so every call needs this bearer token "
                f"(kept in {path}, mode 0600; shown this once):\n{kept}")
    else:
        line = f"tiered-recall http: calls need the bearer token kept in {path}"
    return {kept: TokenScope.of(_scope_value(scope))}, line


def _scope_value(scope: Optional[str]):
    if scope is None:
        return None
    if scope.startswith("["):
        try:
            return json.loads(scope)
        except ValueError:
            raise InvalidInput(f"--scope {scope}: give a namespace name (users/alice) or a JSON list of labels "
                               "([\"users\", \"alice\"])") from None
    return scope
