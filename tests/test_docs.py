"""Every code block in the README and docs/ runs as written: Python blocks are executed (twice, so an example that
stores duplicates when run again fails), command-line blocks are run line by line against a fresh store, and the
set-up commands are the ones .ci/run runs. A block marked `text` is not code (a diagram, a file name)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "benchmarks" / "README.md"]
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.M | re.S)
CLI = str(Path(sys.executable).parent / "tiered-recall")
# The README's set-up commands make a virtual environment, so they run in CI (.ci/run, .ci/wheel), not here: each is
# matched to the step that runs it.
SETUP_COMMANDS = {
    "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/tiered-recall demo":
        ("tests/cli/test_cli.py", "test_demo_prints_hits_and_tiers"),
    'python3 -m venv .venv && .venv/bin/pip install ".[test]" && .venv/bin/pytest':
        (".ci/run", '.venv/bin/pip install ".[test]"'),
}


# docs/cli.md's conversation-per-line file, written where its ingest line runs.
TRIPS = '{"id": "trip", "dialogue": [{"speaker": "Ana", "utterance": "Let us go to Porto", "time": "2026-05-01"}]}'


def test_the_files_the_blocks_read_are_the_ones_shown():
    assert f"```text\n{TRIPS}\n```" in (ROOT / "docs" / "cli.md").read_text()


def blocks(language: str) -> list[tuple[str, str]]:
    found = []
    for document in DOCUMENTS:
        for match in FENCE.finditer(document.read_text()):
            if match.group(1) == language:
                found.append((f"{document.relative_to(ROOT)}:{document.read_text()[:match.start()].count(chr(10)) + 1}",
                              match.group(2)))
    return found


def test_every_block_says_its_language():
    for document in DOCUMENTS:
        for match in FENCE.finditer(document.read_text()):
            assert match.group(1) in ("python", "bash", "text", "javascript", "shell"), (
                f"{document.relative_to(ROOT)}: a code block marked {match.group(1)!r}: mark it python or bash (run "
                "by this test), javascript or shell (curl against a live server: tests/http/test_http_docs.py), or "
                "text (not code)")


@pytest.fixture
def user_store(tmp_path, stop_sidecar_after):
    """A user data folder of its own (where TieredMemory() and the CLI keep the default store); its sidecar is
    stopped afterwards."""
    stop_sidecar_after(tmp_path / "data" / "tiered-recall" / "store")
    return {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}


@pytest.mark.parametrize("where, code", blocks("python"), ids=[where for where, _ in blocks("python")])
def test_python_blocks_run_and_run_again_to_the_same_output(where, code, user_store, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(code)
    runs = [subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                           env=user_store) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, f"{where}:\n{run.stderr}"
    first, second = (re.sub(r"\d+(\.\d+)? (us|ms)\b", r"<time> \2", run.stdout) for run in runs)
    assert first == second, f"{where} prints something else when run again (stored twice?)"
    if where.startswith("README.md"):  # what its comments promise: two memories in alice, id 1 replaced
        assert second.splitlines()[-1] == "2 Ana is vegan now", second


@pytest.mark.parametrize("where, code", blocks("bash"), ids=[where for where, _ in blocks("bash")])
def test_command_line_blocks_run(where, code, user_store, tmp_path):
    (tmp_path / "chat.jsonl").write_text(  # the log the README's ingest line names
        '{"role": "user", "content": "My sister Ana moved to Porto", "session": "s1"}\n'
        '{"role": "assistant", "content": "Porto is lovely in spring", "session": "s1"}\n')
    (tmp_path / "trips.jsonl").write_text(TRIPS + "\n")  # the file docs/cli.md shows and ingests
    for line in (raw.strip() for raw in code.splitlines()):
        if not line or line.startswith("#"):
            continue
        if line.startswith("python3 -m venv"):
            assert line in SETUP_COMMANDS, f"{where}: a set-up command no CI step runs: {line}"
            file, text = SETUP_COMMANDS[line]
            assert text in (ROOT / file).read_text(), f"{where}: {file} no longer runs {line!r}"
            continue
        assert line.startswith("tiered-recall "), f"{where}: run by this test, so it must be a tiered-recall command"
        run = subprocess.run(CLI + line[len("tiered-recall"):], shell=True, capture_output=True, text=True,
                             timeout=300, cwd=tmp_path, env=user_store)
        assert run.returncode == 0, f"{where}: {line}\n{run.stderr}"
