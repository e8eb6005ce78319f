"""The LoCoMo development split as a recall benchmark reads it: questions with their evidence turns (ids normalised
as the data README says), R@k per category, and the paper's DRAGON figures to compare with."""
from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

DATA_FILE = "locomo_dev.json"
# Where a checkout finds the dev split: ../shared/data/locomo beside the repository (its README).
DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "locomo"
KS = (5, 10, 25)
CATEGORIES = (1, 2, 3, 4, 5)
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
# Maharana et al. 2024, Table 3, DRAGON over dialog turns, all ten conversations.
DRAGON = {5: 56.7, 10: 66.2, 25: 76.7}
_DIA_ID = re.compile(r"^D:?(\d+):0*(\d+)$")


@dataclass
class Question:
    """One LoCoMo question: its conversation (sample_id), text, category (1-5) and evidence turns (dia_ids "D1:3").
    The chats set (testing/chats.py) fills it too: its kind as the category, turn positions as the evidence."""

    conversation: str
    text: str
    category: int | str
    evidence: frozenset[str]


@dataclass
class EvidenceStats:
    """Evidence ids rewritten to the canonical form, ids dropped as unknown, and questions left with no evidence."""

    normalised: int = 0
    dropped: int = 0
    questions_without_evidence: int = 0


def normalise_evidence(raw: Sequence[Any], known: set[str], stats: EvidenceStats) -> frozenset[str]:
    """The evidence turns of one question as canonical dia_ids "D<session>:<turn>" (an entry may hold several, split
    at ; or ,), keeping those in `known`; counts what was rewritten or dropped in stats."""
    found = set()
    for entry in raw:
        for piece in re.split(r"[;,]", str(entry)):
            piece = piece.strip()
            if not piece:
                continue
            match = _DIA_ID.match(piece)
            canonical = f"D{int(match.group(1))}:{int(match.group(2))}" if match else piece
            if canonical != piece or len(str(entry).strip()) != len(piece):
                stats.normalised += 1
            if canonical in known:
                found.add(canonical)
            else:
                stats.dropped += 1
    return frozenset(found)


def load_questions(data_file: Path) -> tuple[list[Question], EvidenceStats]:
    """The questions of categories 1-5 of a LoCoMo data file, evidence normalised; those left with no evidence are
    counted in the stats and left out."""
    samples = json.loads(data_file.read_text(encoding="utf-8"))
    stats = EvidenceStats()
    questions = []
    for sample in samples:
        conversation = sample["conversation"]
        known = {
            turn["dia_id"]
            for name, turns in conversation.items()
            if re.fullmatch(r"session_\d+", name) and isinstance(turns, list)
            for turn in turns
        }
        for qa in sample["qa"]:
            if qa.get("category") not in CATEGORIES:
                continue
            evidence = normalise_evidence(qa.get("evidence") or [], known, stats)
            if not evidence:
                stats.questions_without_evidence += 1
                continue
            questions.append(Question(sample["sample_id"], qa["question"], int(qa["category"]), evidence))
    return questions, stats


def recall_table(questions: list[Question], retrieved: list[list[str]],
                 ks: Sequence[int] = KS) -> dict[str, dict[int, float]]:
    """{"all" | category: {k: R@k in percent}}."""
    sums: dict[str, dict[int, float]] = defaultdict(lambda: dict.fromkeys(ks, 0.0))
    counts: dict[str, int] = defaultdict(int)
    for question, ranking in zip(questions, retrieved):
        for group in ("all", str(question.category)):
            counts[group] += 1
            for k in ks:
                sums[group][k] += len(question.evidence & set(ranking[:k])) / len(question.evidence)
    return {group: {k: 100 * sums[group][k] / counts[group] for k in ks} for group in sums}


@dataclass
class _StoredTurn:
    id: int
    text: str
    namespace: str
    metadata: dict[str, Any]


@dataclass
class ExactSearchSink:
    """An ingest target that keeps what ingest writes (per namespace) in memory: benchmarks/locomo_tune.py sweeps the
    retrieval stages over it without a store."""

    embedder: Any  # an Embedder: embeds what ingest hands over without vectors
    records: dict[int, _StoredTurn] = field(default_factory=dict)
    vectors: dict[int, np.ndarray] = field(default_factory=dict)

    def add(self, texts, *, vectors=None, namespace, ids=None, session=None, role=None, metadata=None, created_at=None):
        """Keeps the texts, their metadata and vectors (embedded as passages when none come), as TieredMemory.add."""
        if vectors is None:
            vectors = self.embedder.embed_passages(texts)
        for row, (memory_id, text) in enumerate(zip(ids, texts)):
            self.records[memory_id] = _StoredTurn(memory_id, text, namespace, dict(metadata[row] or {}))
            self.vectors[memory_id] = vectors[row]
        return list(ids)

    def get(self, ids):
        """The kept turns of these ids (None for an unknown one), as TieredMemory.get."""
        return [self.records.get(i) for i in ids]
