"""Shapes ingest was not told about: a conversation per line with any turn field names (turns_field), namespace
templates with their documented placeholders only, records that yield no turns, and a record's own id and
namespace (what an export writes)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiered_recall.errors import InvalidInput
from tiered_recall.ingest import ingest


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


DIALOGUES = [
    {"id": "d1", "dialogue": [{"speaker": "Ana", "utterance": "I moved to Lisbon.", "time": "2024-05-01T10:00:00Z"},
                              {"speaker": "Bo", "utterance": "How is the weather?", "time": "2024-05-01T10:01:00Z"}]},
    {"id": "d2", "dialogue": [{"speaker": "Ana", "utterance": "The flat has a balcony."}]},
]


def test_a_conversation_per_line_with_its_own_turn_fields(memory, tmp_path):
    path = write_jsonl(tmp_path / "talks.jsonl", DIALOGUES)
    summary = ingest(path, memory=memory, progress=False, turns_field="dialogue", role_field="speaker",
                     text_field="utterance", time_field="time", namespace="talk-{conversation}")
    assert summary.formats == {"conversation": 1} and summary.added == 3 and summary.conversations == 2
    records = list(memory.records.values())
    assert [(r.namespace, r.role, r.text) for r in records] == [
        ("talk-d1", "Ana", "I moved to Lisbon."), ("talk-d1", "Bo", "How is the weather?"),
        ("talk-d2", "Ana", "The flat has a balcony.")]
    assert records[0].created_at.isoformat() == "2024-05-01T10:00:00+00:00"


def test_a_text_field_that_holds_the_turns_is_a_bad_record_that_names_the_fix(memory, tmp_path):
    path = write_jsonl(tmp_path / "talks.jsonl", DIALOGUES)
    with pytest.raises(InvalidInput, match=r"talks.jsonl:1: .*turns_field='dialogue' and their text field with "
                                           r"text_field=\.\.\.; fix the record or pass skip_bad=True$"):
        ingest(path, memory=memory, progress=False, text_field="dialogue")  # Python's spelling alone, no flags
    summary = ingest(path, memory=memory, progress=False, text_field="dialogue", skip_bad=True)
    assert summary.bad_records == 2 and summary.added == 0  # reported as bad, never skipped silently


def test_a_conversation_without_turns_is_a_bad_record(memory, tmp_path):
    path = write_jsonl(tmp_path / "empty.jsonl", [{"id": "c1", "messages": []}])
    with pytest.raises(InvalidInput, match="empty.jsonl:1: .*no turns"):
        ingest(path, memory=memory, progress=False)


@pytest.mark.parametrize("template, want", [
    ("{file}", {"chat.jsonl"}), ("{stem}", {"chat"}), ("s-{session}", {"s-s1", "s-s2"}),
    ("{stem}-{conversation}", {"chat-s1", "chat-s2"}),
])
def test_namespace_placeholders(memory, tmp_path, template, want):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"role": "user", "content": "a", "session": "s1"},
                                                 {"role": "user", "content": "b", "session": "s2"}])
    ingest(path, memory=memory, progress=False, namespace=template)
    assert {r.namespace for r in memory.records.values()} == want


def test_an_unknown_placeholder_is_an_error_not_a_literal(memory, tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"role": "user", "content": "a"}])
    with pytest.raises(InvalidInput, match=r"unknown placeholder\(s\) \['nope'\].*\{file\}, \{stem\}"):
        ingest(path, memory=memory, progress=False, namespace="chat-{nope}")
    assert memory.records == {}


def test_an_exported_memory_keeps_its_id_namespace_and_exact_metadata(memory, tmp_path):
    path = write_jsonl(tmp_path / "export.jsonl", [
        {"memory_id": "3952096011494383915", "namespace": "alice", "role": "user", "content": "Ana is vegetarian",
         "session": "s1", "timestamp": "2024-01-02T03:04:05+00:00", "metadata": {"source_app": "chat"}}])
    first = ingest(path, memory=memory, progress=False)
    (record,) = memory.records.values()
    assert record.id == 3952096011494383915 and record.namespace == "alice" and record.session == "s1"
    assert record.metadata == {"source_app": "chat"}  # nothing of this reading added
    assert (first.added, first.unchanged) == (1, 0)
    again = ingest(path, memory=memory, progress=False)
    assert (again.added, again.updated, again.unchanged, again.embedded) == (0, 0, 1, 0)


def test_a_chat_logs_own_message_ids_are_not_memory_ids(memory, tmp_path):
    """Only memory_id (what export writes) names a memory: a log's "id": 1, 2 ... in two files must not collide."""
    for name in ("a.jsonl", "b.jsonl"):
        write_jsonl(tmp_path / name, [{"id": 1, "role": "user", "content": f"first of {name}"},
                                      {"id": "msg_2", "role": "assistant", "content": f"second of {name}"}])
    summary = ingest([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], memory=memory, progress=False)
    assert summary.added == 4 and len(memory.records) == 4
    assert 1 not in memory.records


def test_a_malformed_memory_id_is_a_bad_record(memory, tmp_path):
    path = write_jsonl(tmp_path / "export.jsonl", [{"memory_id": "12x", "content": "a"}])
    with pytest.raises(InvalidInput, match=r"field 'memory_id' must be a memory id"):
        ingest(path, memory=memory, progress=False)
