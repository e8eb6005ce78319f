"""Ingest pipeline: deterministic ids, re-ingest adds nothing, changes update in place, SIGKILL then resume is exact."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ingest_fakes import FakeMemory, SqliteMemory
from tiered_recall.embedders import WordLlamaEmbedder
from tiered_recall.errors import InvalidInput
from tiered_recall.ingest import IngestProgress, ingest, turn_id

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"
TESTS = Path(__file__).parent


def write_messages(path: Path, texts: list[str], *, session: str = "s") -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for index, text in enumerate(texts):
            handle.write(json.dumps({"role": "user" if index % 2 == 0 else "assistant", "content": text,
                                     "session": session}) + "\n")
    return path


def test_turn_ids_are_deterministic_positive_63_bit() -> None:
    first = turn_id(namespace="a", conversation_key="c", position="1")
    assert first == turn_id(namespace="a", conversation_key="c", position="1")
    assert 0 < first < 2**63
    others = {turn_id(namespace=n, conversation_key=c, position=p)
              for n, c, p in [("b", "c", "1"), ("a", "d", "1"), ("a", "c", "2"), ("a", "c1", ""), ("a", "", "c1")]}
    assert first not in others and len(others) == 5


def test_reingest_adds_nothing_and_embeds_nothing(memory: FakeMemory) -> None:
    first = ingest(FIXTURES / "sharegpt.json", memory=memory, progress=False)
    snapshot = {i: (r.text, r.metadata["content_hash"]) for i, r in memory.records.items()}
    calls = memory.add_calls
    second = ingest(FIXTURES / "sharegpt.json", memory=memory, progress=False)
    assert first.added == 4 and second.added == 0 and second.updated == 0 and second.unchanged == 4
    assert second.embedded == 0 and memory.add_calls == calls
    assert {i: (r.text, r.metadata["content_hash"]) for i, r in memory.records.items()} == snapshot


def test_changed_turn_is_updated_under_the_same_id(memory: FakeMemory, tmp_path: Path) -> None:
    path = write_messages(tmp_path / "chat.jsonl", ["one", "two", "three"])
    ingest(path, memory=memory, progress=False)
    ids = list(memory.records)
    write_messages(path, ["one", "two (edited)", "three", "four"])
    summary = ingest(path, memory=memory, progress=False)
    # "three" is updated too: its vector mixes in the previous turn, which changed.
    assert (summary.added, summary.updated, summary.unchanged) == (1, 2, 1)
    alone = ingest(path, memory=FakeMemory(memory.embedder), progress=False, context_turns=0)
    assert alone.added == 4
    assert list(memory.records)[:3] == ids
    assert [r.text for r in memory.records.values()] == ["one", "two (edited)", "three", "four"]


def test_new_template_reembeds_as_updates(memory: FakeMemory) -> None:
    ingest(FIXTURES / "sharegpt.json", memory=memory, progress=False, template="plain")
    before = {i: r.vector.copy() for i, r in memory.records.items()}
    summary = ingest(FIXTURES / "sharegpt.json", memory=memory, progress=False, template="speaker")
    assert summary.updated == 4 and set(memory.records) == set(before)
    assert all(r.metadata["template"] == "speaker" for r in memory.records.values())
    assert not all(np.allclose(before[i], r.vector) for i, r in memory.records.items())


def test_stored_text_is_the_turn_and_vector_is_the_templated_text(memory: FakeMemory) -> None:
    ingest(FIXTURES / "locomo_mini.json", memory=memory, progress=False, template="dated_said", context_turns=1,
           context_weight=None)
    records = list(memory.records.values())
    assert records[1].text == "Nice! Show me what you made. [shares a photo of a blue ceramic bowl]"
    expected = memory.embedder([
        '[9:15 am on 3 March, 2023] Ada said, "I started pottery classes on Tuesday."\n'
        'Bo said, "Nice! Show me what you made. [shares a photo of a blue ceramic bowl]"'
    ])[0]
    np.testing.assert_allclose(records[1].vector, expected, atol=1e-6)


def test_context_mixed_as_vectors(memory: FakeMemory) -> None:
    ingest(FIXTURES / "locomo_mini.json", memory=memory, progress=False, template="said", context_turns=1,
           context_weight=0.5)
    first, second, third = memory.records.values()
    # the context is the previous turn as the template writes it: the vector that turn was stored with
    turn, previous = memory.embedder(['Bo said, "Nice! Show me what you made. [shares a photo of a blue ceramic bowl]"',
                                      'Ada said, "I started pottery classes on Tuesday."'])
    expected = (turn + 0.5 * previous) / np.linalg.norm(turn + 0.5 * previous)
    np.testing.assert_allclose(second.vector, expected, atol=1e-5)
    np.testing.assert_allclose(first.vector, memory.embedder(['Ada said, "I started pottery classes on Tuesday."'])[0],
                               atol=1e-6)  # the first turn has no context
    assert third.metadata["dia_id"] == "D2:1"
    with pytest.raises(InvalidInput, match="context_weight"):
        ingest(FIXTURES / "locomo_mini.json", memory=memory, progress=False, context_weight=-1)


def test_namespace_template_and_default(memory: FakeMemory) -> None:
    ingest(FIXTURES / "openai.jsonl", memory=memory, progress=False, namespace="chat-{conversation}")
    # {conversation} is the conversation's own name (its id, else the file's stem and the record number), not the
    # internal key that memory ids are derived from
    assert {r.namespace for r in memory.records.values()} == {"chat-chat-1", "chat-openai-2", "chat-openai-3"}
    same_turns_elsewhere = FakeMemory(memory.embedder)
    ingest(FIXTURES / "openai.jsonl", memory=same_turns_elsewhere, progress=False, namespace="work")
    assert not set(same_turns_elsewhere.records) & set(memory.records)  # ids include the namespace


def test_batches_and_progress_callback(memory: FakeMemory, tmp_path: Path) -> None:
    path = write_messages(tmp_path / "long.jsonl", [f"message number {i}" for i in range(25)])
    updates: list[IngestProgress] = []
    summary = ingest(path, memory=memory, batch_size=10, progress=updates.append)
    assert summary.batches == 3 and memory.add_calls == 3
    assert [u.turns_read for u in updates] == [10, 20, 25]
    assert updates[-1].bytes_read == updates[-1].bytes_total == path.stat().st_size


def test_failed_batch_leaves_nothing_partial_and_rerun_completes(memory: FakeMemory, tmp_path: Path) -> None:
    path = write_messages(tmp_path / "chat.jsonl", [f"turn {i}" for i in range(30)])
    memory.fail_on_add = 2
    with pytest.raises(RuntimeError, match="simulated crash"):
        ingest(path, memory=memory, batch_size=10, progress=False)
    assert len(memory.records) == 10  # the first batch only
    memory.fail_on_add = None
    summary = ingest(path, memory=memory, batch_size=10, progress=False)
    assert (summary.added, summary.unchanged) == (20, 10)
    clean = FakeMemory(memory.embedder)
    ingest(path, memory=clean, batch_size=10, progress=False)
    assert {i: r.text for i, r in memory.records.items()} == {i: r.text for i, r in clean.records.items()}


def test_summary_json(memory: FakeMemory) -> None:
    summary = ingest(FIXTURES / "messages.jsonl", memory=memory, progress=False)
    data = json.loads(summary.to_json())
    assert data["added"] == 4 and data["skipped"] == 1 and data["files"] == 1 and data["formats"] == {"jsonl": 1}
    assert data["turns_per_s"] > 0 and "4 added" in str(summary)


def test_option_errors(memory: FakeMemory) -> None:
    for options, message in [({"context_turns": -1}, "context_turns"), ({"template": "fancy"}, "unknown template"),
                             ({"text_field": ""}, "text_field"), ({"template": "{text} {mood}"}, "unknown field")]:
        with pytest.raises(InvalidInput, match=message):
            ingest(FIXTURES / "messages.jsonl", memory=memory, progress=False, **options)
    with pytest.raises(InvalidInput, match="no .embedder"):
        ingest(FIXTURES / "messages.jsonl", memory=object(), progress=False)  # type: ignore[arg-type]


KILL_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from ingest_fakes import SqliteMemory
from tiered_recall.embedders import WordLlamaEmbedder
from tiered_recall.ingest import ingest
memory = SqliteMemory({db!r}, WordLlamaEmbedder(dim=64), add_delay_s=0.05)
ingest({data!r}, memory=memory, batch_size=7, progress=False, namespace="{{conversation}}")
"""


def test_sigkill_then_rerun_ends_exactly_like_one_clean_run(embedder: WordLlamaEmbedder, tmp_path: Path) -> None:
    data = tmp_path / "conversations.jsonl"
    with open(data, "w", encoding="utf-8") as handle:
        for conversation in range(12):
            messages = [{"role": "user", "content": f"conversation {conversation} says thing {turn}"} for turn in range(10)]
            handle.write(json.dumps({"id": f"c{conversation}", "messages": messages}) + "\n")
    killed_db = tmp_path / "killed.sqlite"
    process = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT.format(tests=str(TESTS), db=str(killed_db), data=str(data))],
        env={**os.environ, "PYTHONPATH": str(TESTS)},
        cwd=tmp_path,  # not the checkout: its source tree would shadow the installed package
    )
    try:
        deadline = time.monotonic() + 60
        rows = 0
        while time.monotonic() < deadline and process.poll() is None:
            if killed_db.exists():
                connection = sqlite3.connect(killed_db)
                try:
                    rows = connection.execute("SELECT count(*) FROM memories").fetchone()[0]
                except sqlite3.OperationalError:
                    rows = 0
                finally:
                    connection.close()
                if rows >= 30:
                    break
            time.sleep(0.01)
        assert process.poll() is None, "the ingest finished before it could be killed"
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    assert process.returncode == -signal.SIGKILL
    resumed = SqliteMemory(str(killed_db), embedder)
    committed = {(json.loads(row[6])["conversation_key"], int(json.loads(row[6])["position"])) for row in resumed.snapshot()}
    partial = len(committed)
    reading_order = [(f"c{conversation}", turn) for conversation in range(12) for turn in range(10)]
    assert 30 <= partial < 120
    assert committed == set(reading_order[:partial])  # whole adds, in order: nothing partial, no gaps
    summary = ingest(data, memory=resumed, batch_size=7, progress=False, namespace="{conversation}")
    assert summary.unchanged == partial and summary.added == 120 - partial and summary.updated == 0
    clean = SqliteMemory(str(tmp_path / "clean.sqlite"), embedder)
    ingest(data, memory=clean, batch_size=7, progress=False, namespace="{conversation}")
    assert resumed.snapshot() == clean.snapshot()
    resumed.close()
    clean.close()
