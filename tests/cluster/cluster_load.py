"""What the long cluster tests share: filling namespaces, finding a shard on a worker node, and load (writers that
record every acknowledged write, searchers that check exact answers) while a fault is made."""
from __future__ import annotations

import threading

import numpy as np

from tiered_recall.cluster import status
from tiered_recall.errors import ClusterUnavailable, ShardUnavailable, StorageError

from exact import Model, same_answer, unit

DIM = 8


def fill(memory, model: Model, namespaces, rng, rows: int = 3) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def add(ns):
        vectors = rng.standard_normal((rows, DIM)).astype(np.float32)
        model.put(ns, memory.add([f"{ns} #{j}" for j in range(rows)], vectors=vectors, namespace=ns), vectors)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(add, namespaces))


def shard_on_a_worker(name: str, ray_nodes) -> tuple[str, object]:
    """A shard that runs on a worker node (not the head, whose loss ends the Ray cluster), and that node."""
    head = ray_nodes.cluster.head_node.node_id
    for shard in status(name)["shards"]:
        if shard["node"] != head and ray_nodes.node_of_id(shard["node"]) is not None:
            return shard["shard"], ray_nodes.node_of_id(shard["node"])
    raise AssertionError("no shard runs on a worker node")


class Load:
    """Writers that record every acknowledged write (ids drawn by the client, so a retried add is one row), and
    searchers that check exact answers over namespaces nobody writes to; both run until stop()."""

    def __init__(self, memory, model: Model, written, still, writers: int = 3, searchers: int = 1) -> None:
        self.memory, self.model, self.still = memory, model, still
        self.acknowledged: dict[int, str] = {}
        self.failures: list = []
        self.wrong: list = []
        self.checked = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._write, args=(list(written), seed)) for seed in range(writers)]
        self._threads += [threading.Thread(target=self._search, args=(seed,)) for seed in range(searchers)]
        for thread in self._threads:
            thread.start()

    def _write(self, namespaces, seed: int) -> None:
        rng = np.random.default_rng(100 + seed)
        while not self._stop.is_set():
            ns = namespaces[int(rng.integers(len(namespaces)))]
            try:
                ids = self.memory.add(["under load"], vectors=rng.standard_normal((1, DIM)), namespace=ns)
                self.acknowledged[ids[0]] = ns
            except (ClusterUnavailable, ShardUnavailable, StorageError) as exc:  # clear failures, counted
                self.failures.append(type(exc).__name__)

    def _search(self, seed: int) -> None:
        rng = np.random.default_rng(200 + seed)
        while not self._stop.is_set():
            q, ns = unit(rng, DIM), self.still[int(rng.integers(len(self.still)))]
            try:
                if not same_answer(self.memory.search(q, k=3, namespace=ns), self.model.exact(q, 3, namespace=ns)):
                    self.wrong.append(ns)
                self.checked += 1
            except (ClusterUnavailable, ShardUnavailable, StorageError) as exc:  # clear failures, counted
                self.failures.append(type(exc).__name__)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
