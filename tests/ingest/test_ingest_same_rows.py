"""Ingest with its writer thread stores exactly what the one-thread pipeline of 040a8e2 stored: the rows (ids, texts,
namespaces, sessions, roles, times, metadata, vectors within float tolerance: kept to 8 decimals) after a first run
and after a re-run over changed and added turns, against rows_040a8e2.json.gz, which
`python tests/ingest/test_ingest_same_rows.py OUT` wrote with 040a8e2's tiered_recall on the path."""
from __future__ import annotations

import gzip
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from tiered_recall.ingest import ingest

REFERENCE = Path(__file__).parent / "fixtures" / "ingest" / "rows_040a8e2.json.gz"
DIM = 16


class TextHashEmbedder:
    """Each text's vector drawn from a generator seeded by its hash: deterministic, cheap, and different per text."""

    name, dim = "text-hash-16", DIM

    def embed_passages(self, texts):
        return np.stack([np.random.default_rng(int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little"))
                         .standard_normal(DIM) for t in texts]).astype(np.float32)

    embed_queries = __call__ = embed_passages


class RecordingMemory:
    """Keeps every row as the last add wrote it."""

    def __init__(self) -> None:
        self.embedder = TextHashEmbedder()
        self.rows: dict[int, dict] = {}

    def add(self, texts, *, vectors=None, namespace, ids=None, session=None, role=None, metadata=None,
            created_at=None):
        for row, memory_id in enumerate(ids):
            self.rows[memory_id] = {
                "id": memory_id, "text": texts[row], "namespace": namespace, "session": session[row],
                "role": role[row], "created_at": None if created_at[row] is None else created_at[row].isoformat(),
                "metadata": metadata[row], "vector": [round(float(v), 8) for v in vectors[row]]}
        return list(ids)

    def get(self, ids):
        return [_Stored(self.rows[i]) if i in self.rows else None for i in ids]


class _Stored:
    def __init__(self, row: dict) -> None:
        self.__dict__.update(row)


def _conversations(changed: bool) -> str:
    """Five conversations interleaved (so batches hold several namespaces and contexts cross batch boundaries);
    changed: some turns edited and turns added to two conversations."""
    lines = []
    for turn in range(60):
        for conversation in range(5):
            text = f"conversation {conversation} turn {turn}: " + " ".join(["word"] * (turn % 7))
            if changed and turn % 11 == 3 and conversation % 2 == 0:
                text += " (edited)"
            lines.append({"session": f"c{conversation}", "role": "user" if turn % 2 else "assistant", "content": text,
                          "timestamp": f"2024-05-{1 + turn % 28:02d}T10:{turn % 60:02d}:00Z"})
    if changed:
        lines += [{"session": f"c{conversation}", "role": "user",
                   "content": f"conversation {conversation} late turn {t}"}
                  for conversation in (1, 3) for t in range(17)]
    return "\n".join(json.dumps(line) for line in lines) + "\n"


def stored_rows(folder: Path) -> list[list[dict]]:
    """The rows after a first ingest and after a re-ingest of the changed file (batches of 64 turns)."""
    memory = RecordingMemory()
    snapshots = []
    for changed in (False, True):
        path = folder / "conversations.jsonl"
        path.write_text(_conversations(changed))
        ingest(path, memory=memory, namespace="{conversation}", batch_size=64, progress=False)
        snapshots.append([dict(memory.rows[i]) for i in sorted(memory.rows)])
    return snapshots


def test_stored_rows_are_the_one_thread_pipelines(tmp_path: Path) -> None:
    expected = json.loads(gzip.decompress(REFERENCE.read_bytes()))
    got = stored_rows(tmp_path)
    assert [len(snapshot) for snapshot in got] == [len(snapshot) for snapshot in expected] == [300, 334]
    for snapshot, reference in zip(got, expected):
        for row, want in zip(snapshot, reference):
            np.testing.assert_allclose(row.pop("vector"), want.pop("vector"), rtol=0, atol=1e-7)
            assert row == want


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        Path(sys.argv[1]).write_bytes(gzip.compress(json.dumps(stored_rows(Path(folder))).encode(), mtime=0))
