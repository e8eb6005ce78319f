"""Ingestion readers: every format from small fixtures, auto-detection, field mapping, gzip, stdin, bad input."""
from __future__ import annotations

import gzip
import io
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ingest_fakes import FakeMemory
from tiered_recall.errors import InvalidInput
from tiered_recall.ingest import IngestSummary, ingest

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"


def stored(memory: FakeMemory) -> list:
    """Records in reading order (ingest writes in file order; dicts keep insertion order)."""
    return list(memory.records.values())


def run(path, memory: FakeMemory, **options) -> IngestSummary:
    return ingest(path, memory=memory, progress=False, **options)


def test_jsonl_messages(memory: FakeMemory) -> None:
    summary = run(FIXTURES / "messages.jsonl", memory)
    records = stored(memory)
    assert [r.text for r in records] == [
        "I adopted a beagle named Biscuit last week.",
        "Congratulations on Biscuit! Beagles are curious dogs.",
        "My sister is moving to Lisbon in June.",
        "Here is a photo of the new flat.",
    ]
    assert [r.role for r in records] == ["user", "assistant", "user", "user"]
    assert [r.session for r in records] == ["s1", "s1", "s2", "s2"]
    assert records[0].created_at == datetime(2024, 5, 1, 9, 0, tzinfo=timezone.utc)
    assert records[2].created_at == datetime(2024, 6, 1, 8, 0, tzinfo=timezone.utc)  # epoch seconds
    assert records[3].created_at is None
    assert {r.namespace for r in records} == {"default"}
    assert summary.formats == {"jsonl": 1}
    assert summary.turns_read == 5 and summary.added == 4
    assert summary.skipped == {"no text (empty content, e.g. a tool call)": 1}
    assert summary.conversations == 2


def test_openai_conversation_per_line(memory: FakeMemory) -> None:
    summary = run(FIXTURES / "openai.jsonl", memory)
    records = stored(memory)
    assert summary.formats == {"openai": 1}
    assert summary.conversations == 3 and summary.added == 6  # the system prompt is not a memory
    assert summary.skipped_total == 1 and any("system message" in reason for reason in summary.skipped)
    assert [r.role for r in records[:2]] == ["user", "assistant"]
    assert records[0].session == "chat-1"  # the record's own id
    assert records[2].session == "openai.jsonl#2"  # no id: source name and record number
    assert records[-1].text == "Still one conversation."


def test_system_messages_are_kept_when_asked(memory: FakeMemory) -> None:
    from tiered_recall.ingest import ingest

    summary = ingest(FIXTURES / "openai.jsonl", memory=memory, progress=False, keep_system=True)
    assert summary.added == 7 and [r.role for r in stored(memory)[:1]] == ["system"]


def test_openai_single_document_and_message_list(memory: FakeMemory) -> None:
    run(FIXTURES / "openai_single.json", memory)
    assert [(r.session, r.text) for r in stored(memory)] == [
        ("single-1", "What is the capital of Portugal?"), ("single-1", "Lisbon.")]
    other = FakeMemory(memory.embedder)
    summary = run(FIXTURES / "openai_list.json", other, format="openai")
    assert [r.text for r in stored(other)] == [
        "First message of a file that is a list of messages.", "Second message.", "Third message."]
    assert summary.conversations == 1


def test_sharegpt(memory: FakeMemory) -> None:
    summary = run(FIXTURES / "sharegpt.json", memory)
    records = stored(memory)
    assert summary.formats == {"sharegpt": 1} and summary.conversations == 2
    assert [(r.session, r.role) for r in records] == [("sg-1", "human"), ("sg-1", "gpt"), ("sg-2", "human"), ("sg-2", "gpt")]
    assert records[1].text.startswith("Soft rain on the roof")


def test_locomo_keeps_dia_ids_dates_and_captions(memory: FakeMemory) -> None:
    summary = run(FIXTURES / "locomo_mini.json", memory, namespace="{conversation}")
    records = stored(memory)
    assert summary.formats == {"locomo": 1} and summary.added == 3
    assert [r.metadata["dia_id"] for r in records] == ["D1:1", "D1:2", "D2:1"]
    assert {r.namespace for r in records} == {"mini-1"}
    assert records[0].metadata["conversation"] == "mini-1"
    assert records[0].metadata["session_date"] == "9:15 am on 3 March, 2023"
    assert records[0].created_at == datetime(2023, 3, 3, 9, 15, tzinfo=timezone.utc)
    assert records[1].text == "Nice! Show me what you made. [shares a photo of a blue ceramic bowl]"
    assert records[1].metadata["image_caption"] == "a photo of a blue ceramic bowl"
    assert [r.session for r in records] == ["session_1", "session_1", "session_2"]
    assert records[2].role == "Ada"


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [("messages.jsonl", "jsonl"), ("openai.jsonl", "openai"), ("openai_single.json", "openai"),
     ("sharegpt.json", "sharegpt"), ("locomo_mini.json", "locomo"), ("openai_list.json", "jsonl")],
)
def test_auto_detection(memory: FakeMemory, fixture: str, expected: str) -> None:
    assert run(FIXTURES / fixture, memory).formats == {expected: 1}


def test_field_mapping_with_dotted_names(memory: FakeMemory) -> None:
    with pytest.raises(InvalidInput, match="cannot tell the format"):
        run(FIXTURES / "custom_fields.jsonl", memory)
    summary = run(FIXTURES / "custom_fields.jsonl", memory, text_field="said", role_field="meta.author.role",
                  session_field="thread", time_field="at")
    records = stored(memory)
    assert summary.added == 2
    assert [r.text for r in records] == ["The launch moved to Thursday.", "Then QA needs the build by Tuesday."]
    assert [r.role for r in records] == ["pm", "dev"]
    assert {r.session for r in records} == {"t-9"}
    assert records[1].created_at == datetime.fromtimestamp(1714560060, tz=timezone.utc)


def test_gzip_and_folder_give_the_same_ids_as_the_plain_file(memory: FakeMemory, tmp_path: Path) -> None:
    run(FIXTURES / "messages.jsonl", memory)
    plain_ids = set(memory.records)
    folder = tmp_path / "exports"
    folder.mkdir()
    with open(FIXTURES / "messages.jsonl", "rb") as source, gzip.open(folder / "messages.jsonl.gz", "wb") as target:
        shutil.copyfileobj(source, target)
    (folder / "notes.txt").write_text("ignored: not a conversation file")
    zipped = FakeMemory(memory.embedder)
    summary = run(folder, zipped)
    assert summary.files == 1
    assert set(zipped.records) == plain_ids  # ".gz" is not part of the source name
    again = run(folder, memory)
    assert again.added == 0 and again.unchanged == 4


def test_stdin(memory: FakeMemory, monkeypatch: pytest.MonkeyPatch) -> None:
    data = (FIXTURES / "sharegpt.json").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(data))))
    summary = run("-", memory)
    assert summary.formats == {"sharegpt": 1} and summary.added == 4


def test_bad_line_names_file_and_line_and_keeps_what_came_before(memory: FakeMemory) -> None:
    path = FIXTURES / "bad_line.jsonl"
    with pytest.raises(InvalidInput, match=r"bad_line\.jsonl:3: not valid JSON.*skip_bad=True"):
        run(path, memory)
    assert [r.text for r in stored(memory)] == ["line one is fine", "line two is fine"]


def test_skip_bad_counts_and_continues(memory: FakeMemory) -> None:
    summary = run(FIXTURES / "bad_line.jsonl", memory, skip_bad=True)
    assert summary.bad_records == 1 and summary.added == 3
    assert summary.bad_examples[0].startswith(f"{FIXTURES / 'bad_line.jsonl'}:3: not valid JSON")
    assert "line four is fine" in [r.text for r in stored(memory)]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("name", "text", "error"),
    [
        ("wrong_shape.jsonl", '{"role": "user", "content": "ok"}\n{"role": "user", "text_missing": 1}\n',
         r"wrong_shape\.jsonl:2: jsonl record: expected a message with a text field"),
        ("array.json", '[\n {"id": "a", "conversations": [{"from": "human", "value": "hi"}]},\n {"id": "b", "conversations": 7}\n]',
         r"array\.json:3: sharegpt record: expected an object with a 'conversations' list"),
        ("unclosed.json", '[\n {"id": "a", "conversations": [{"from": "human", "value": "hi"}]},\n {"id": "b", "conv',
         r"unclosed\.json:3: not valid JSON"),
        ("bad_time.jsonl", '{"role": "user", "content": "hi", "timestamp": "last tuesday"}\n',
         r"bad_time\.jsonl:1: .*'timestamp' = 'last tuesday' is not a time; use ISO 8601"),
        ("bad_content.jsonl", '{"role": "user", "content": 42}\n', r"bad_content\.jsonl:1: .*must be a string or a list"),
        ("surrogate.jsonl", '{"role": "user", "content": "bad \\ud800 text"}\n', r"surrogate\.jsonl:1: .*lone surrogate"),
        ("message_in_openai.jsonl", '{"messages": [{"role": "user", "content": "ok"}, "not an object"]}\n',
         r"message_in_openai\.jsonl:1: openai record: messages\[1\]"),
        ("unknown.jsonl", '{"foo": 1}\n', r"unknown\.jsonl:1: cannot tell the format .*keys \[foo\]"),
        ("locomo_bad.json", '[{"sample_id": "x", "conversation": {"session_1": [{"speaker": "A", "text": "no id"}]}}]',
         r"locomo_bad\.json:1: locomo record: x session_1\[0\]: expected \{speaker, dia_id, text\}"),
    ],
)
def test_bad_records_raise_with_file_and_line(memory: FakeMemory, tmp_path: Path, name: str, text: str, error: str) -> None:
    with pytest.raises(InvalidInput, match=error):
        run(write(tmp_path, name, text), memory)


def test_non_utf8_bytes_are_reported(memory: FakeMemory, tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"role": "user", "content": "ok"}\n{"role": "user", "content": "caf\xe9"}\n')
    with pytest.raises(InvalidInput, match=r"latin1\.jsonl:2: the file is not UTF-8"):
        run(path, memory)


def test_skip_bad_in_an_unreadable_array_stops_that_file_only(memory: FakeMemory, tmp_path: Path) -> None:
    broken = write(tmp_path, "a_broken.json", '[{"id": "a", "conversations": [{"from": "human", "value": "kept"}]}, {"id": ')
    summary = run([broken, FIXTURES / "sharegpt.json"], memory, skip_bad=True)
    assert summary.bad_records == 1 and summary.files == 2
    assert summary.added == 5


def test_boundary_errors(memory: FakeMemory, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="no such file or folder"):
        run(tmp_path / "missing.jsonl", memory)
    with pytest.raises(InvalidInput, match="format must be one of"):
        run(FIXTURES / "messages.jsonl", memory, format="csv")
    with pytest.raises(InvalidInput, match="holds no"):
        run(tmp_path, memory)
    with pytest.raises(InvalidInput, match="batch_size"):
        run(FIXTURES / "messages.jsonl", memory, batch_size=0)
    with pytest.raises(InvalidInput, match="namespace"):
        run(FIXTURES / "messages.jsonl", memory, namespace="")
    with pytest.raises(InvalidInput, match="paths is empty"):
        run([], memory)
    assert memory.records == {}


def test_empty_file_is_fine(memory: FakeMemory, tmp_path: Path) -> None:
    summary = run(write(tmp_path, "empty.jsonl", "\n\n"), memory)
    assert summary.turns_read == 0 and summary.files == 1


def test_errors_name_the_keywords_and_no_flag(memory: FakeMemory, tmp_path: Path) -> None:
    odd_log = write(tmp_path, "odd.jsonl", '{"speaker": "me", "words": "hello"}\n{"speaker": "me"}\n')
    with pytest.raises(InvalidInput) as info:
        ingest(odd_log, memory=memory, progress=False, text_field="words")
    assert str(info.value).endswith("map the field with text_field=...; fix the record or pass skip_bad=True")
    with pytest.raises(InvalidInput, match=r"^batch_size must be a positive integer, got 0$"):
        ingest(odd_log, memory=memory, progress=False, batch_size=0)
    with pytest.raises(InvalidInput, match=r"use format='auto' or format='conversation', not 'jsonl'$"):
        ingest(odd_log, memory=memory, progress=False, format="jsonl", turns_field="x")
