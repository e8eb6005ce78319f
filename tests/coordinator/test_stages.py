"""The retrieval stages (coordinator/stages.py) on hand-made pools: fusion, the keyword match, neighbouring turns,
temporal cues, the session spread, and the checks on their weights."""
from __future__ import annotations

import pytest

from tiered_recall.coordinator.stages import Candidate, Stages, fuse, keyword_match, rerank
from tiered_recall.errors import InvalidInput


def turn(memory_id: int, score: float, index: int, *, text: str = "something", session: str = "s1",
         conversation: str = "c") -> Candidate:
    return Candidate(memory_id, score, text, session, {"turn_index": index, "conversation_key": conversation})


def ids(ranked) -> list[int]:
    return [candidate.id for candidate, _ in ranked]


def test_fuse_is_reciprocal_rank_with_the_keyword_weight() -> None:
    fused = fuse([1, 2], [2, 3], 0.5)
    assert fused[1] == pytest.approx(1 / 61)
    assert fused[2] == pytest.approx(1 / 62 + 0.5 / 61)
    assert fused[3] == pytest.approx(0.5 / 62)


def test_no_stage_keeps_the_pools_order() -> None:
    pool = [turn(5, 0.9, 0), turn(3, 0.8, 7), turn(4, 0.8, 9)]
    assert ids(rerank(pool, "anything", 3, Stages())) == [5, 3, 4]


def test_a_turn_next_to_a_strong_one_rises() -> None:
    # 2 follows the best turn 1; 3 scores a little higher alone but has no pooled neighbour
    pool = [turn(1, 1.0, 10), turn(3, 0.62, 40), turn(2, 0.6, 11), turn(4, 0.0, 70)]
    assert ids(rerank(pool, "q", 4, Stages()))[:3] == [1, 3, 2]
    assert ids(rerank(pool, "q", 4, Stages(neighbour_weight=0.2)))[:3] == [1, 2, 3]


def test_a_neighbour_lifts_a_turn_towards_it_never_past_it() -> None:
    # 2 scores below its neighbour 1 and rises halfway to it; 1 is not lifted by its weaker neighbour; even at the
    # largest weight the turn lifted only ties the one that lifted it, and ties keep the pool's order
    pool = [turn(1, 1.0, 10), turn(3, 0.9, 40), turn(2, 0.5, 11), turn(4, 0.0, 70)]
    ranked = rerank(pool, "q", 4, Stages(neighbour_weight=0.5))
    assert ids(ranked) == [1, 3, 2, 4] and [round(score, 3) for _, score in ranked] == [1.0, 0.9, 0.75, 0.0]
    assert ids(rerank(pool, "q", 4, Stages(neighbour_weight=1.0)))[:2] == [1, 2]


def test_neighbours_are_within_one_conversation() -> None:
    pool = [turn(1, 1.0, 10, conversation="a"), turn(3, 0.62, 40), turn(2, 0.6, 11, conversation="b"),
            turn(4, 0.0, 70)]
    assert ids(rerank(pool, "q", 4, Stages(neighbour_weight=0.2)))[:3] == [1, 3, 2]


def test_a_time_is_named_alike_in_ascii_and_in_any_other_text() -> None:
    """The ASCII shortcut (lowercased, then a case-sensitive scan) finds what the case-insensitive scan finds."""
    from tiered_recall.coordinator.stages import _TIME_WORDS, names_a_time

    texts = ["We met LAST WEEK", "last  week", "lastweek", "Last Night was fun", "in 2023!", "x2023", "1999s",
             "Mondays", "on Monday", "next Year", "this weekend?", "a while AGO", "recently-ish", "2019_", "in 1899",
             "Sunday", "Café last week", "naïve Tuesday", "ſunday", "\u212aelvin", "TODAY", "tod ay", "10 days ago."]
    for text in texts:
        names_a_time.cache_clear()
        assert names_a_time(text) == (_TIME_WORDS.search(text) is not None), text


def test_temporal_cue_only_for_a_question_asking_when() -> None:
    pool = [turn(1, 1.0, 0, text="I love painting"), turn(2, 0.95, 5, text="I went there last week"),
            turn(3, 0.0, 9)]
    stages = Stages(temporal_weight=0.1)
    assert ids(rerank(pool, "When did she go?", 3, stages))[:2] == [2, 1]
    assert ids(rerank(pool, "What does she love?", 3, stages))[:2] == [1, 2]


def test_session_spread_charges_repeats_of_a_session() -> None:
    pool = [turn(1, 1.0, 0, session="a"), turn(2, 0.95, 3, session="a"), turn(3, 0.9, 8, session="b"),
            turn(4, 0.0, 20, session="c")]
    assert ids(rerank(pool, "q", 3, Stages())) == [1, 2, 3]
    assert ids(rerank(pool, "q", 3, Stages(session_spread=0.2))) == [1, 3, 2]


def test_scores_are_the_pools_scaled_to_one_plus_the_stages() -> None:
    pool = [turn(1, 0.9, 0, text="Miso is my cat"), turn(2, 0.7, 1), turn(3, 0.5, 9)]
    ranked = rerank(pool, "What is my cat called?", 3, Stages(keyword_weight=0.5, neighbour_weight=0.5))
    # 1 holds both of the question's words (cat, called: only cat is in the pool, and called weighs in the whole)
    cat_share = keyword_match("What is my cat called?", [c.text for c in pool])[0]
    assert 0 < cat_share < 1
    assert [round(score, 3) for _, score in ranked] == [round(1 + 0.5 * cat_share, 3),
                                                         round(0.5 + 0.5 * (1 + 0.5 * cat_share - 0.5), 3), 0.0]


def test_keyword_match_weighs_a_rare_word_over_a_common_one() -> None:
    texts = ["we planted the garden today", "Miso sleeps in the garden", "the garden needs water",
             "garden party on Sunday"]
    shares = keyword_match("Where does Miso sleep in the garden?", texts)
    assert shares[1] == pytest.approx(1.0)  # holds every word of the question (sleeps: plurals are stemmed)
    assert 0 < shares[0] == shares[2] == shares[3] < 0.2  # "garden" alone: every text holds it
    assert keyword_match("Where does Miso sleep?", texts).tolist() == [0.0, 1.0, 0.0, 0.0]


def test_keyword_match_leaves_question_words_out() -> None:
    texts = ["when we go there it rains", "classes on tuesdays and thursdays"]
    assert keyword_match("When are my classes?", texts).tolist() == [0.0, 1.0]
    assert keyword_match("When was it?", texts).tolist() == [0.0, 0.0]  # nothing left to match
    assert keyword_match("anything", []).shape == (0,)


def test_a_word_the_candidates_share_lifts_them_alike_and_a_rare_one_decides() -> None:
    pool = [turn(1, 0.9, 0, text="the cake was great"), turn(2, 0.85, 5, text="I baked a cake"),
            turn(3, 0.8, 9, text="lemon cake, my mum's recipe"), turn(4, 0.0, 20, text="see you")]
    assert ids(rerank(pool, "What cake?", 4, Stages(keyword_weight=1.0))) == [1, 2, 3, 4]
    assert ids(rerank(pool, "What lemon cake?", 4, Stages(keyword_weight=1.0))) == [3, 1, 2, 4]


@pytest.mark.parametrize("options, fix", [
    ({"neighbour_weight": -1}, "neighbour_weight must be a number from 0 to 1,"),
    ({"neighbour_weight": 1.5}, "neighbour_weight must be a number from 0 to 1,"),
    ({"keyword_weight": None}, "keyword_weight must be a number from 0 to 10"),
    ({"temporal_weight": "high"}, "temporal_weight must be a number"),
    ({"bm25_weight": 0}, "bm25_weight must be None or a number in"),
    ({"pool": 0}, "pool must be an int from 1"),
    ({"session_spread": True}, "session_spread must be a number"),
])
def test_bad_weights_name_the_fix(options, fix: str) -> None:
    with pytest.raises(InvalidInput, match=fix):
        Stages(**options)


def test_a_store_reads_the_words_of_what_it_adds_before_a_search_pools_them(tmp_path) -> None:
    from tiered_recall import TieredMemory
    from tiered_recall.coordinator import stages

    texts = [f"Caroline went to the support group on day {i}" for i in range(40)]
    with TieredMemory(tmp_path / "store", preset="fast", device="none") as memory:
        assert memory.preset.stages.keyword_weight
        stages._terms.cache_clear()
        stages.names_a_time.cache_clear()
        memory.add(texts, namespace="chat")
        assert stages._terms.cache_info().currsize == stages.names_a_time.cache_info().currsize == len(texts)
        misses = stages._terms.cache_info().misses, stages.names_a_time.cache_info().misses
        hits = memory.search("When did Caroline go to the support group?", namespace="chat", k=5)
        assert hits  # and the search read no memory's text again: no word set and no time cue worked out
        assert (stages._terms.cache_info().misses, stages.names_a_time.cache_info().misses) == misses


def test_a_turn_whose_conversation_key_cannot_be_hashed_has_no_neighbours() -> None:
    # a list as the conversation key (metadata is JSON) is read as no place in a conversation, not an error
    odd = Candidate(2, 0.5, "something", "s1", {"turn_index": 11, "conversation_key": ["c"]})
    pool = [turn(1, 1.0, 10), turn(3, 0.6, 40), odd, turn(4, 0.0, 70)]
    assert ids(rerank(pool, "q", 4, Stages(neighbour_weight=1.0))) == [1, 3, 2, 4]


def test_the_feature_cache_follows_a_replaced_memory() -> None:
    from types import SimpleNamespace

    from tiered_recall.coordinator.stages import NO_NEIGHBOUR, UNPLACED, FeatureCache

    cache = FeatureCache(limit=3)
    first = SimpleNamespace(id=7, text="a dog in the park", metadata={"turn_index": 3, "conversation_key": "c"})
    [features] = cache.of([first])
    assert "dog" in features.terms and not features.timed
    assert cache.of([first])[0] is features  # the same memory: its features are not worked out again
    replaced = SimpleNamespace(id=7, text="a cat last week", metadata={})
    [features] = cache.of([replaced])  # the store's cache replaced memory 7: its features follow the new one
    assert "cat" in features.terms and features.timed
    assert (features.place, features.before, features.after) == (UNPLACED, NO_NEIGHBOUR, NO_NEIGHBOUR)
    turns = [SimpleNamespace(id=i, text=f"text {i}", metadata={"turn_index": i, "conversation_key": "c"})
             for i in (4, 5)]
    [fourth, fifth] = cache.of(turns)
    assert fourth.after == fifth.place and fifth.before == fourth.place and fourth.before != fifth.after
    others = [SimpleNamespace(id=i, text=f"text {i}", metadata={"turn_index": 0, "conversation_key": "d"})
              for i in range(3)]
    again = cache.of(others)  # past the limit: the cache starts again before the call, and numbers places anew
    assert [f.terms for f in again] == [frozenset({str(i), "text"}) for i in range(3)]
    assert again[0].place == again[1].place == again[2].place == 0
    assert cache.of([turns[0]])[0] is not fourth  # not kept across the new start
