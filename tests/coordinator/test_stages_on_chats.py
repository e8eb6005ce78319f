"""The presets' retrieval stages on the chats set (benchmarks/data/chats), conversations of other shapes than the
LoCoMo dev split: through ingest and TieredMemory.search, R@5 with the stages is at least R@5 of the vector search
alone (stages=False), for each preset. The fast preset (WordLlama) takes about 4 s on the 2-core machine; the
quality preset (E5 embeds the 479 turns on the CPU) about 40 s, so it is marked slow."""
from __future__ import annotations

from pathlib import Path

import pytest

from tiered_recall import TieredMemory, ingest
from tiered_recall.testing.chats import conversation_files, load_questions
from tiered_recall.testing.locomo import recall_table

pytestmark = pytest.mark.lancedb
CHATS = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "chats"


def recall_at_5(memory: TieredMemory, questions, *, staged: bool) -> float:
    retrieved = [[hit.metadata["position"] for hit in memory.search(question.text, k=5, namespace=question.conversation,
                                                                     stages=None if staged else False)]
                 for question in questions]
    return recall_table(questions, retrieved, ks=(5,))["all"][5]


@pytest.mark.parametrize("preset", ["fast", pytest.param("quality", marks=pytest.mark.slow)])
def test_the_stages_do_not_lower_recall_at_5_on_chats_of_other_shapes(tmp_path, stop_sidecar_after, preset) -> None:
    path = tmp_path / "store"
    stop_sidecar_after(path)
    questions = load_questions(CHATS)
    assert len(questions) >= 150 and len({q.conversation for q in questions}) >= 15
    with TieredMemory(path, preset=preset, device="cpu") as memory:
        summary = ingest(conversation_files(CHATS), memory=memory, namespace="{conversation}", progress=False)
        assert summary.added == summary.turns_read > 0
        staged, alone = recall_at_5(memory, questions, staged=True), recall_at_5(memory, questions, staged=False)
    assert staged >= alone, f"{preset}: R@5 {staged:.1f} with the stages, {alone:.1f} without"
