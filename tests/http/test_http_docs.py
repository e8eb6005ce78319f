"""The JavaScript and curl examples of the docs run as written, against a live server over a real store: every
```javascript block under Node (skipped where no node is installed, as the examples need it), every ```shell block
line by line under bash, the docs' default address replaced by the test server's."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from http_helpers import ADMIN
from tiered_recall.http import HttpSettings, TokenScope, create_app

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.M | re.S)
DOCS_ADDRESS = "http://127.0.0.1:8765"


def blocks(language: str) -> list[tuple[str, str]]:
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == language:
                found.append((f"{document.relative_to(ROOT)}:{text[:match.start()].count(chr(10)) + 1}",
                              match.group(2)))
    return found


@pytest.fixture
def docs_server(text_store, serve):
    """The app over a text store (fast preset), with a token, on a free port: (url, environment for the examples)."""
    settings = HttpSettings(tokens={ADMIN: TokenScope()})
    server = serve(create_app(text_store, settings=settings))
    return server.url, {**os.environ, "TR_URL": server.url, "TR_TOKEN": ADMIN}


def test_the_docs_have_examples_to_run():
    assert blocks("javascript") and blocks("shell")


@pytest.mark.parametrize("where, code", blocks("javascript"), ids=[w for w, _ in blocks("javascript")])
def test_javascript_blocks_run_against_a_live_server(where, code, docs_server, tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the JavaScript examples need Node 18 or later")
    url, env = docs_server
    script = tmp_path / "example.mjs"  # a module: the examples await at the top level
    script.write_text(code)
    run = subprocess.run([node, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, f"{where}:\n{run.stderr}"
    lines = run.stdout.splitlines()
    assert lines[0] == "stored 2" and lines[-1] == "left 1", run.stdout
    assert any(line.endswith("Alice is vegetarian") for line in lines[1:3]), run.stdout
    assert any(line.startswith("rule ") and line.endswith(" ms in the store") for line in lines), run.stdout


@pytest.mark.parametrize("where, code", blocks("shell"), ids=[w for w, _ in blocks("shell")])
def test_shell_blocks_run_against_a_live_server(where, code, docs_server, tmp_path):
    url, env = docs_server
    for line in (raw.strip() for raw in code.splitlines()):
        if not line or line.startswith("#"):
            continue
        assert line.startswith("curl "), f"{where}: run by this test, so it must be a curl command"
        run = subprocess.run(["bash", "-c", line.replace(DOCS_ADDRESS, url)], capture_output=True, text=True,
                             timeout=60, env=env)
        assert run.returncode == 0, f"{where}: {line}\n{run.stderr}"
        if "/metrics" in line:
            assert "tiered_recall_added_rows_total" in run.stdout
            continue
        answer = json.loads(run.stdout)
        assert "error" not in answer, f"{where}: {line}\n{answer}"
