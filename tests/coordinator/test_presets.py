"""Presets through TieredMemory: the default is `quality` (E5 with its stages), a store keeps the embedder and preset
it was made with, a staged search is exact (the same answer from the hot tier as from the cold tier alone), and the
stages' options are checked."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tiered_recall import InvalidInput, Stages, TieredMemory, ingest
from tiered_recall.embedders import E5Embedder, WordLlamaEmbedder

pytestmark = pytest.mark.lancedb
DIM = 384
TURNS = [
    ("Caroline", "I went to a LGBTQ support group yesterday and it was so powerful."),
    ("Melanie", "Wow, that's cool! What happened there?"),
    ("Caroline", "The transgender stories were so inspiring, I felt accepted."),
    ("Melanie", "I painted a lake sunrise last year, it's special to me."),
    ("Caroline", "I'm keen on counselling and mental health work now."),
    ("Melanie", "My kids love the beach; we go camping every summer."),
]


@pytest.fixture
def chat_file(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps({"role": "user", "name": speaker, "content": text}) for speaker, text in TURNS))
    return path


def test_the_default_is_quality_and_a_text_search_runs_its_stages(open_memory, chat_file) -> None:
    memory = open_memory(dim=None, embedder=TieredMemory.__init__.__kwdefaults__["embedder"])
    assert memory.preset.name == "quality" and isinstance(memory.embedder, E5Embedder)
    summary = ingest(chat_file, memory=memory, namespace="chat", progress=False)
    assert summary.added == len(TURNS)
    assert sorted(m.metadata["turn_index"] for m in memory.memories()) == list(range(len(TURNS)))
    report = memory.search("When did Caroline go to the support group?", namespace="chat", k=3, explain=True)
    assert report.stages == memory.preset.stages and report.path == "hot" and report.rule == "complete"
    assert report.hits[0].text == TURNS[0][1]
    plain = memory.search("When did Caroline go to the support group?", namespace="chat", k=3, explain=True,
                          stages=False)
    assert plain.stages is None and plain.path == "hot" and all(-1 <= hit.score <= 1 for hit in plain)


def test_a_staged_search_is_the_same_from_either_tier(tmp_path, chat_file, stop_sidecar_after) -> None:
    path = tmp_path / "store"
    stop_sidecar_after(path)
    questions = ["Who paints?", "When did Caroline go to the support group?", "beach camping", "counselling career"]
    with TieredMemory(path, device="cpu", preset="fast") as memory:
        ingest(chat_file, memory=memory, namespace="chat", progress=False)
        hot = [[(h.id, round(h.score, 6)) for h in memory.search(q, namespace="chat", k=4)] for q in questions]
        tiers = {h.tier for q in questions for h in memory.search(q, namespace="chat", k=4)}
    assert tiers == {"hot"}
    with TieredMemory(path, device="none", preset="fast") as memory:
        cold = [[(h.id, round(h.score, 6)) for h in memory.search(q, namespace="chat", k=4)] for q in questions]
    assert cold == hot


def test_a_store_keeps_the_embedder_and_preset_it_was_made_with(tmp_path, stop_sidecar_after) -> None:
    path = tmp_path / "store"
    stop_sidecar_after(path)
    with TieredMemory(path, embedder="wordllama", device="cpu") as memory:
        memory.add(["kept with wordllama"], namespace="n")
    with TieredMemory(path, device="cpu") as memory:  # the defaults: what the store was made with
        assert isinstance(memory.embedder, WordLlamaEmbedder) and memory.preset.name == "fast"
        assert memory.search("wordllama", namespace="n", k=1)[0].text == "kept with wordllama"
    with pytest.raises(InvalidInput, match="open it with embedder='wordllama:256', or leave embedder out"):
        TieredMemory(path, embedder="e5", device="cpu")


def test_stage_options_are_checked(open_memory) -> None:
    memory = open_memory(dim=None, embedder="wordllama")
    memory.add(["one memory"], namespace="n")
    with pytest.raises(InvalidInput, match="needs a text query"):
        memory.search(np.ones(256, np.float32) / 16, namespace="n", stages=Stages(neighbour_weight=0.1))
    with pytest.raises(InvalidInput, match="stages must be None"):
        memory.search("one", namespace="n", stages="on")
    with pytest.raises(InvalidInput, match="unknown preset"):
        open_memory(dim=None, embedder="wordllama", preset="best")
    custom = memory.search("one", namespace="n", stages=Stages(bm25_weight=2.0), explain=True)
    assert custom.stages == Stages(bm25_weight=2.0) and custom.hits[0].text == "one memory"


def test_a_staged_search_under_a_prefix_keeps_to_it(open_memory) -> None:
    memory = open_memory(dim=None, embedder="wordllama", preset="fast")
    memory.add(["alice likes green tea"], namespace=("users", "alice"))
    memory.add(["bob likes tea too"], namespace=("users", "bob"))
    memory.add(["tea grows elsewhere"], namespace=("other",))
    report = memory.search("tea", namespace_prefix=("users",), k=5, explain=True)
    assert report.stages is not None
    assert sorted(hit.text for hit in report) == ["alice likes green tea", "bob likes tea too"]
    assert memory.search("tea", namespace_prefix=("nobody",), k=5) == []
