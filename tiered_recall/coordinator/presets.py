"""The named retrieval presets: an embedder, how ingest writes turns for it, and the stages a text search runs,
chosen together on the LoCoMo dev split and the tune half of the chats set in benchmarks/data/chats (docs/recall.md
has the figures behind each choice)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidInput
from .stages import Stages


@dataclass(frozen=True)
class Preset:
    """embedder: a name for resolve_embedder. stages: what a text search runs after the exact vector search. Both
    presets were tuned over ingest's defaults (template "dated_said", the previous turn mixed in at weight 0.3)."""

    name: str
    embedder: str
    stages: Stages
    summary: str


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset("quality", "e5",
               Stages(keyword_weight=0.8, neighbour_weight=0.5, temporal_weight=0.1, pool=64),
               "multilingual-e5-small (int8 on the CPU, float16 on a GPU) with keyword match and neighbouring turns"),
        # A static embedder ranks less surely than E5, so the question's words weigh more beside it.
        Preset("fast", "wordllama",
               Stages(keyword_weight=1.6, neighbour_weight=0.5, temporal_weight=0.1, pool=64),
               "WordLlama static embeddings (microseconds a query) with keyword match and neighbouring turns"),
    )
}
DEFAULT_PRESET = "quality"


class _PresetEmbedder:
    """The default of TieredMemory's embedder argument: the preset's embedder (or the store's recorded one)."""

    def __repr__(self) -> str:
        return "<the preset's embedder>"


PRESET_EMBEDDER = _PresetEmbedder()
# A store made before presets existed records only its embedder; it reopens with the preset built on that embedder.
PRESET_OF_EMBEDDER_NAME = {"multilingual-e5-small-384": "quality", "wordllama-l2_supercat-256": "fast"}


def resolve_preset(preset: str | Preset | None) -> Preset:
    """A preset name, a Preset, or None (DEFAULT_PRESET) -> a Preset."""
    if preset is None:
        return PRESETS[DEFAULT_PRESET]
    if isinstance(preset, Preset):
        return preset
    if isinstance(preset, str) and preset in PRESETS:
        return PRESETS[preset]
    raise InvalidInput(f"unknown preset {preset!r}; use one of {sorted(PRESETS)} or a tiered_recall.Preset")
