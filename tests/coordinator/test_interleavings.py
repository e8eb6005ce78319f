"""Random interleavings of three processes over one store (tiered_recall.testing.interleavings): adds, upserts,
deletes, reopens, sidecar kills and searches, each search checked against exact search over a model of the rows.
A failure prints the seed and the operation log; benchmarks/interleavings.py runs the same for longer."""
from __future__ import annotations


import pytest

from tiered_recall.testing.interleavings import run

pytestmark = [pytest.mark.lancedb, pytest.mark.slow]


@pytest.mark.parametrize("seed", [11, 12])
def test_every_search_is_exact_while_processes_interleave(tmp_path, seed):
    result = run(tmp_path / "store", seed=seed, ops=2000, workers=3, devices=("none", "cpu"))
    assert sum(result.counts.values()) == 2000
    assert result.counts["search"] > 800 and result.counts["kill_sidecar"] > 0 and result.counts["reopen"] > 0
    # the skip rules were exercised, not only the cold tier
    assert result.rules.get("complete", 0) > 0 and result.rules.get("cold", 0) > 0


@pytest.mark.gpu
def test_every_search_is_exact_with_a_cuda_worker(tmp_path):
    result = run(tmp_path / "store", seed=21, ops=1500, workers=3, devices=("none", "cpu", "cuda"))
    assert "cuda" in result.devices
    assert result.rules.get("complete", 0) > 0
