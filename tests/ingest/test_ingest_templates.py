"""Templates: each named template's exact output, dates, context turns, custom format strings and callables."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tiered_recall.errors import InvalidInput
from tiered_recall.ingest import DEFAULT_TEMPLATE, TEMPLATES, Turn, resolve_template


def make_turn(text: str, *, role: str | None = "Ada", date_text: str | None = "3 March 2023",
              created_at: datetime | None = None) -> Turn:
    return Turn(source="f", line=1, conversation_key="c", position="1", text=text, role=role,
                session="s1", created_at=created_at, date_text=date_text)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("plain", "I bought a kayak."),
        ("speaker", "Ada: I bought a kayak."),
        ("said", 'Ada said, "I bought a kayak."'),
        ("dated_speaker", "[3 March 2023] Ada: I bought a kayak."),
        ("dated_said", '[3 March 2023] Ada said, "I bought a kayak."'),
    ],
)
def test_named_templates(name: str, expected: str) -> None:
    assert resolve_template(name)(make_turn("I bought a kayak."), ()) == expected


def test_default_is_a_named_template_and_every_template_is_documented() -> None:
    assert DEFAULT_TEMPLATE in TEMPLATES
    assert all(template.description for template in TEMPLATES.values())


def test_dates_fall_back_to_created_at_and_vanish_when_absent() -> None:
    dated = make_turn("hi", date_text=None, created_at=datetime(2024, 5, 1, 9, 30, tzinfo=timezone.utc))
    assert TEMPLATES["dated_said"](dated, ()) == '[01 May 2024, 09:30] Ada said, "hi"'
    undated = make_turn("hi", date_text=None, role=None)
    assert TEMPLATES["dated_said"](undated, ()) == 'Someone said, "hi"'


def test_context_turns_come_first_without_dates() -> None:
    previous = make_turn("Any plans?", role="Bo")
    turn = make_turn("Kayaking.")
    assert TEMPLATES["dated_said"](turn, (previous,)) == '[3 March 2023] Bo said, "Any plans?"\nAda said, "Kayaking."'
    assert TEMPLATES["plain"](turn, (previous,)) == "Any plans?\nKayaking."


def test_custom_format_string_and_callable() -> None:
    custom = resolve_template("{speaker} ({date}) in {session}: {text}")
    assert custom(make_turn("hello"), ()) == "Ada (3 March 2023) in s1: hello"
    assert resolve_template(lambda turn, context: turn.text.upper())(make_turn("hey"), ()) == "HEY"


@pytest.mark.parametrize(("template", "message"), [
    ("nonexistent", "unknown template"), ("{text} {mood}", "unknown field"), ("{text} {", "not a valid format"), (3, "must be"),
])
def test_bad_templates(template, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        resolve_template(template)
