"""HotTier.expect: a client about to send a request (a text search embedding its query) keeps the sidecar awake until
then, wakes a sleeping one, and cannot keep it awake for longer than the layout's limit."""
from __future__ import annotations

import os
import re
import time
import uuid

import numpy as np
import pytest

from tiered_recall.hot import HotTier, layout as L, start_sidecar

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="a sidecar polls only while the clients leave a "
                                                                   "core free: needs 2 cores")


def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.001)
    return condition()


def asleep(hot: HotTier) -> bool:
    return hot._header.server_sleeping == 1


def test_an_expected_request_keeps_the_sidecar_awake_until_then(start):
    _, hot = start(dim=8, capacity=16, idle_spin_us=200)
    assert wait_for(lambda: asleep(hot), 2.0), "an idle sidecar goes to sleep after its idle spin"
    asked = time.monotonic()
    hot.expect(1.0)  # past the limit: the sidecar waits AWAKE_AHEAD_MAX_NS at most
    assert wait_for(lambda: not asleep(hot), 1.0), "expect wakes a sleeping sidecar"
    limit_s = L.AWAKE_AHEAD_MAX_NS / 1e9
    while time.monotonic() - asked < 0.7 * limit_s:
        assert not asleep(hot)
        time.sleep(0.001)
    assert wait_for(lambda: asleep(hot), 2.0), "once the expected time has passed it sleeps again"
    q = np.full(8, 1 / np.sqrt(8), dtype=np.float32)
    assert hot.search(q, k=1).hits == 0  # and still answers


def test_a_deadline_past_the_limit_is_brought_back_to_it(start):
    _, hot = start(dim=8, capacity=16, idle_spin_us=200)
    assert wait_for(lambda: asleep(hot), 2.0)
    hot._header.awake_until_ns = 2**64 - 1  # a stray write: as far ahead as the field reaches
    hot.expect(0.0)  # rings the bell
    assert wait_for(lambda: not asleep(hot), 1.0)
    limit_s = L.AWAKE_AHEAD_MAX_NS / 1e9
    assert wait_for(lambda: asleep(hot), limit_s + 2.0), "the server brings the deadline back to its own limit"
    assert hot._header.awake_until_ns < time.monotonic_ns() + L.AWAKE_AHEAD_MAX_NS


@pytest.mark.gpu
def test_an_expected_search_finds_the_cuda_sidecar_awake_and_the_gpu_free(persistent_kernel):
    name = f"t-{uuid.uuid4().hex[:12]}"
    proc = start_sidecar(name, dim=64, capacity=4096, dtype="f16", backend="cuda", idle_spin_us=200,
                         cuda_verbose=True, **persistent_kernel)
    hot = HotTier.attach(name)
    try:
        x = np.random.default_rng(5).standard_normal((1000, 64)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        hot.upsert(np.arange(1, 1001, dtype=np.int64), x, np.zeros(1000, np.uint64))
        assert hot.search(x[0], k=5).ids[0, 0] == 1
        for i in range(1, 6):
            hot.expect(0.04)
            time.sleep(0.02)  # a query's embedding: far longer than the 200 us idle spin
            assert not asleep(hot), "the sidecar polls for the expected request"
            assert hot.search(x[i], k=5).ids[0, 0] == i + 1
        time.sleep(0.3)
        log = proc.log()
        stops = re.findall(r"persistent kernel stopped \((\w+)\) after (\d+) batches", log)
        # the kernel let the GPU go while each query was expected: one run per search
        assert stops == [("idle", "1")] * 6, log
    finally:
        hot.close()
        proc.stop()
