"""The chats set (benchmarks/data/chats) as a recall benchmark reads it: conversations of other shapes than LoCoMo's,
the files of one split, and questions with the turn positions that answer them, scored with locomo.recall_table."""
from __future__ import annotations

import json
from pathlib import Path

from .locomo import Question

SPLITS = ("tune", "held-out")
KINDS = ("single", "paraphrase", "trap", "when", "multi")


def conversation_files(folder: Path, *, split: str | None = None,
                       names: list[str] | None = None) -> list[Path]:
    """The conversation files of a split ("tune", "held-out"; None: all), or of the conversations named, sorted."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    chosen = []
    for path in sorted((folder / "conversations").glob("*.json")):
        conversation = json.loads(path.read_text(encoding="utf-8"))
        if (split is None or conversation["split"] == split) and (names is None or conversation["id"] in names):
            chosen.append(path)
    return chosen


def load_questions(folder: Path, *, conversations: list[Path] | None = None) -> list[Question]:
    """The questions of the set in folder (benchmarks/data/chats in a checkout; not in the wheel) asked of these
    conversation files (None: all), each with its kind as the category and its answer turns as evidence: the turns'
    positions in their conversation ("0", "1", ...), as ingest keeps them in a memory's metadata["position"]."""
    files = conversation_files(folder) if conversations is None else conversations
    wanted = {json.loads(path.read_text(encoding="utf-8"))["id"] for path in files}
    questions = []
    for line in (folder / "questions.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record["conversation"] in wanted:
            questions.append(Question(record["conversation"], record["question"], record["kind"],
                                      frozenset(str(turn) for turn in record["answer_turns"])))
    return questions
