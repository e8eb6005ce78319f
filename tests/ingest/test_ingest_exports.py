"""The chat apps' own exports with no options: ChatGPT's conversations.json (a tree per conversation, read along the
branch the user kept) and Claude's; what is left out and counted, roles, times, re-reading and a later export."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ingest_fakes import FakeMemory
from tiered_recall.errors import InvalidInput
from tiered_recall.ingest import ingest

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"
CHATGPT = FIXTURES / "chatgpt_conversations.json"
CLAUDE = FIXTURES / "claude_conversations.json"
PORTO = "6650f1c2-7d1e-8004-a1b2-000000000001"
BREAD = "6650f1c2-7d1e-8004-a1b2-000000000002"
GARDEN = "1d3c1f6e-5b7a-4c2e-9f00-000000000001"
CAPITAL = "1d3c1f6e-5b7a-4c2e-9f00-000000000002"
SYSTEM_OR_TOOL = "system or tool message (keep_system=True stores them)"
HIDDEN = "hidden message (the app's own, not shown in the chat) (keep_system=True stores them)"
ONLY_OTHER_PARTS = "no text (only images, files or other parts that are not text)"


def run(path, memory: FakeMemory, **options):
    return ingest(path, memory=memory, progress=False, **options)


def stored(memory: FakeMemory) -> list:
    return list(memory.records.values())


def test_both_exports_are_recognised_with_no_options(memory: FakeMemory) -> None:
    summary = run([CHATGPT, CLAUDE], memory)
    assert summary.formats == {"chatgpt": 1, "claude": 1}
    assert summary.conversations == 4 and summary.added == 7 + 6 and summary.bad_records == 0


def test_chatgpt_follows_the_branch_the_user_kept(memory: FakeMemory) -> None:
    run(CHATGPT, memory)
    porto = [r for r in stored(memory) if r.session == PORTO]
    assert [(r.metadata["position"], r.role, r.text) for r in porto] == [
        ("u-1", "user", "I am planning a trip to Porto in June."),
        ("a-1", "assistant", "Porto in June is lovely; the São João festival is on the night of the 23rd."),
        ("u-2b", "user", "Here is the hotel I booked; is it near the river?"),  # the image part left out
        ("a-2b", "assistant", "Yes: the hotel is in Ribeira, two minutes on foot from the Douro."),
        ("a-3", "assistant", "That is the Dom Luís I bridge, seen from the Gaia side."),
    ]
    texts = " ".join(r.text for r in stored(memory))
    assert "museum" not in texts  # the branch the user edited away
    assert "search(" not in texts and "Praça da Ribeira" not in texts  # the browser call and its result
    assert "Lisbon" not in texts  # the hidden custom instructions
    assert [r.metadata["turn_index"] for r in porto] == [0, 1, 2, 3, 4]


def test_chatgpt_counts_what_it_leaves_out(memory: FakeMemory) -> None:
    summary = run(CHATGPT, memory)
    # Porto: 10 messages on the kept branch (the root has none), 5 stored; Sourdough: 4 messages, 2 stored.
    assert summary.turns_read == 14 and summary.added == 7
    assert summary.skipped == {HIDDEN: 2, SYSTEM_OR_TOOL: 3, ONLY_OTHER_PARTS: 1, "not text (thoughts content)": 1}
    assert summary.skipped_parts == {"image_asset_pointer": 2}
    assert summary.to_dict()["skipped_parts"] == {"image_asset_pointer": 2}
    assert "parts left out (not text): 2 image_asset_pointer" in str(summary)


def test_chatgpt_roles_times_titles_and_the_conversation_placeholder(memory: FakeMemory) -> None:
    run(CHATGPT, memory, namespace="chatgpt-{conversation}")
    records = stored(memory)
    assert {r.namespace for r in records} == {f"chatgpt-{PORTO}", f"chatgpt-{BREAD}"}
    first = records[0]
    assert first.created_at == datetime(2024, 6, 1, 8, 0, 0, 500000, tzinfo=timezone.utc)  # epoch seconds, float
    assert first.metadata["title"] == "Trip to Porto" and first.metadata["original_role"] == "user"
    assert {r.role for r in records} == {"user", "assistant"}
    bread = [r for r in records if r.session == BREAD]
    assert [r.text for r in bread] == ["My sourdough starter smells like acetone; is it dead?",
                                       "No: it is hungry. Feed it twice a day at 1:1:1 for three days."]


def test_chatgpt_system_and_tool_messages_are_kept_when_asked(memory: FakeMemory) -> None:
    summary = run(CHATGPT, memory, keep_system=True)
    roles = [(r.role, r.text) for r in stored(memory)]
    assert ("system", "You are a helpful baking assistant.") in roles
    # kept or not, a browser call (code), its result and the hidden custom instructions carry no chat text
    assert summary.skipped["not text (code content)"] == 1
    assert summary.skipped["not text (tether_browsing_display content)"] == 1
    assert summary.skipped["not text (user_editable_context content)"] == 1
    assert summary.added == 8


def test_claude_roles_times_and_parts(memory: FakeMemory) -> None:
    summary = run(CLAUDE, memory, namespace="{conversation}")
    records = stored(memory)
    assert [(r.namespace, r.role, r.metadata["original_role"], r.text) for r in records] == [
        (GARDEN, "user", "human", "I want to grow tomatoes on a north-facing balcony."),
        (GARDEN, "assistant", "assistant", "North-facing gets little sun: try cherry tomatoes and a white wall "
                                           "behind them."),
        (GARDEN, "user", "human", "Here are the measurements and a photo."),
        (GARDEN, "assistant", "assistant", "Two 40-litre pots fit; water them daily in July."),
        (CAPITAL, "user", "human", "What is the capital of Australia?"),
        (CAPITAL, "assistant", "assistant", "Canberra."),
    ]
    assert records[0].created_at == datetime(2024, 5, 2, 8, 0, 5, 123456, tzinfo=timezone.utc)
    assert records[0].metadata["title"] == "Balcony tomatoes" and "title" not in records[-1].metadata  # no name
    assert [r.metadata["position"] for r in records[:2]] == ["m-1", "m-2"]  # the message's own uuid
    assert summary.turns_read == 7 and summary.skipped == {ONLY_OTHER_PARTS: 1}
    assert summary.skipped_parts == {"files": 2, "attachments": 1, "thinking": 1, "tool_use": 1, "tool_result": 1}


def test_reingest_changes_nothing_and_a_later_export_adds_only_what_is_new(memory: FakeMemory,
                                                                          tmp_path: Path) -> None:
    first = run([CHATGPT, CLAUDE], memory)
    again = run([CHATGPT, CLAUDE], memory)
    assert (again.added, again.updated, again.unchanged, again.embedded) == (0, 0, first.added, 0)

    conversations = json.loads(CHATGPT.read_text(encoding="utf-8"))
    porto = conversations[0]
    porto["mapping"]["a-3"]["children"] = ["u-4"]
    porto["mapping"]["u-4"] = {"id": "u-4", "parent": "a-3", "children": [], "message": {
        "id": "u-4", "author": {"role": "user", "name": None, "metadata": {}}, "create_time": 1717229100.0,
        "content": {"content_type": "text", "parts": ["Thanks, booking the boat tour too."]},
        "metadata": {}, "recipient": "all"}}
    porto["current_node"] = "u-4"
    later = tmp_path / CHATGPT.name  # the same file name: each memory notes the file it came from
    later.write_text(json.dumps(conversations), encoding="utf-8")
    grown = run(later, memory)
    assert (grown.added, grown.updated, grown.unchanged) == (1, 0, 7)
    assert stored(memory)[-1].text == "Thanks, booking the boat tour too."


def test_a_conversation_without_current_node_follows_the_newest_children(memory: FakeMemory, tmp_path: Path) -> None:
    porto = json.loads(CHATGPT.read_text(encoding="utf-8"))[0]
    del porto["current_node"]
    path = tmp_path / "no_current.json"
    path.write_text(json.dumps([porto]), encoding="utf-8")
    run(path, memory)
    assert [r.metadata["position"] for r in stored(memory)] == ["u-1", "a-1", "u-2b", "a-2b", "a-3"]


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda c: c.update(current_node="nowhere"), r"current_node 'nowhere' is not in the conversation's mapping"),
        (lambda c: c["mapping"]["a-1"].update(parent="gone"), r"node 'a-1''s parent 'gone' is not in the"),
        (lambda c: c["mapping"]["client-created-root"].update(parent="a-3"), r"the mapping.s parent links loop back"),
        (lambda c: c["mapping"]["a-1"]["message"].update(content="text"), r"mapping\['a-1'\]\.message\.content must"),
    ],
)
def test_a_broken_chatgpt_tree_is_a_bad_record_that_says_where(memory: FakeMemory, tmp_path: Path, change,
                                                               error: str) -> None:
    conversations = json.loads(CHATGPT.read_text(encoding="utf-8"))
    change(conversations[0])
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(conversations), encoding="utf-8")
    with pytest.raises(InvalidInput, match=r"conversations\.json:1: chatgpt record: " + error):
        run(path, memory)
    summary = run(path, FakeMemory(memory.embedder), skip_bad=True)
    assert summary.bad_records == 1 and summary.added == 2  # the second conversation still goes in


def test_a_conversation_repeated_in_one_run_is_read_once(memory: FakeMemory, tmp_path: Path) -> None:
    conversations = json.loads(CLAUDE.read_text(encoding="utf-8"))
    path = tmp_path / "twice.json"
    path.write_text(json.dumps(conversations + conversations[:1]), encoding="utf-8")
    summary = run(path, memory)
    assert summary.added == 6 and sum(c for r, c in summary.skipped.items() if "repeated" in r) == 5
