"""Ingestion of conversation files (JSONL, OpenAI chat, ShareGPT, LoCoMo, ChatGPT and Claude exports) into memories:
tiered_recall.ingest(...)."""
from __future__ import annotations

import sys
import types

from .formats import FORMAT_CHOICES, FORMATS
from .pipeline import DEFAULT_BATCH_SIZE, IngestInterrupted, IngestProgress, MemorySink, ingest
from .summary import IngestSummary
from .templates import DEFAULT_TEMPLATE, TEMPLATES, Template, resolve_template
from .turns import Turn, content_hash, turn_id
from .values import FieldMap

__all__ = [
    "ingest",
    "IngestSummary",
    "IngestProgress",
    "IngestInterrupted",
    "MemorySink",
    "Turn",
    "turn_id",
    "content_hash",
    "FieldMap",
    "FORMATS",
    "FORMAT_CHOICES",
    "TEMPLATES",
    "DEFAULT_TEMPLATE",
    "DEFAULT_BATCH_SIZE",
    "Template",
    "resolve_template",
]


class _CallableModule(types.ModuleType):
    """Lets `tiered_recall.ingest(...)` call the pipeline while `tiered_recall.ingest.formats` stays a module."""

    def __call__(self, *args, **kwargs):
        return ingest(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
