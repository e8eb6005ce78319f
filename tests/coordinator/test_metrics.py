"""Store metrics shared by its processes: `tiered-recall stats` in a new process sees another process's searches,
`tiered-recall serve --metrics-port` serves them to Prometheus, and a configured OpenTelemetry tracer gets a span
per search."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.lancedb
CLI = str(Path(sys.executable).parent / "tiered-recall")

_WORKLOAD = textwrap.dedent("""
    import sys
    from tiered_recall import TieredMemory
    texts = ["Ana is vegan", "the review moved", "a cat called Miso", "rain in Porto"]
    with TieredMemory(sys.argv[1], device=sys.argv[2]) as memory:  # the default embedder, as the CLI opens it
        memory.add(texts[:3], namespace="n")
        memory.add(texts[3], namespace="n")
        for i in range(int(sys.argv[3])):
            memory.search(texts[i % 4], k=2, namespace="n")
""")


def run_workload(store: Path, device: str, searches: int) -> None:
    done = subprocess.run([sys.executable, "-c", _WORKLOAD, str(store), device, str(searches)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_stats_in_a_new_process_counts_every_process_searches(tmp_path):
    store = tmp_path / "s"
    run_workload(store, "none", 7)
    run_workload(store, "none", 5)
    shown = subprocess.run([CLI, "stats", "--store", str(store), "--device", "none"], capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    metrics = json.loads(shown.stdout)["store_metrics"]
    assert metrics["searches"] == 12 and metrics["searches_by_rule"] == {"no-hot": 12}
    assert metrics["adds"] == 4 and metrics["added_rows"] == 8 and metrics["processes"] == 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_metrics_port_serves_the_stores_metrics_to_prometheus(tmp_path):
    store = tmp_path / "s"
    run_workload(store, "cpu", 9)
    port = free_port()
    name = f"metrics-{uuid.uuid4().hex[:8]}"
    log = open(tmp_path / "serve.log", "wb")
    server = subprocess.Popen([CLI, "serve", "--name", name, "--dim", "256", "--capacity", "16", "--metrics-port",
                               str(port), "--store", str(store)], stdout=subprocess.DEVNULL, stderr=log)
    try:
        body, deadline = None, time.monotonic() + 20
        while body is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                    body = response.read().decode()
            except OSError:
                assert server.poll() is None, (tmp_path / "serve.log").read_text()
                time.sleep(0.1)
        assert body is not None
        lines = {line.split(" ")[0]: float(line.split(" ")[1]) for line in body.splitlines()
                 if line.startswith("tiered_recall_")}
        assert lines['tiered_recall_search_seconds_count{path="hot",rule="complete"}'] == 9
        assert lines["tiered_recall_add_seconds_count"] == 2
        assert lines["tiered_recall_added_rows_total"] == 4
        assert lines["tiered_recall_cold_rows"] == 4 and lines["tiered_recall_processes"] == 0
    finally:
        server.send_signal(2)
        status = server.wait(20)
        log.close()
    assert status == 0, (tmp_path / "serve.log").read_text()


def test_a_configured_tracer_gets_a_span_per_search(tmp_path):
    code = textwrap.dedent("""
        import sys, json, numpy as np
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        from tiered_recall import TieredMemory
        with TieredMemory(sys.argv[1], dim=4, embedder=None, device="none") as memory:
            memory.add(["a"], vectors=np.eye(4, dtype=np.float32)[0], namespace="n")
            memory.search(np.eye(4, dtype=np.float32)[0], k=1, namespace="n")
        print(json.dumps([[s.name, dict(s.attributes)] for s in exporter.get_finished_spans()]))
    """)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    spans = json.loads(done.stdout.strip().splitlines()[-1])
    assert [name for name, _ in spans] == ["tiered_recall.search"]
    attributes = spans[0][1]
    assert attributes["rule"] == "no-hot" and attributes["path"] == "cold" and attributes["hits"] == 1
    assert attributes["namespace"] == "n" and attributes["k"] == 1


def test_a_tracer_configured_after_searches_began_is_seen_within_the_recheck(tmp_path):
    code = textwrap.dedent("""
        import sys, json, time, numpy as np
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from tiered_recall import TieredMemory
        from tiered_recall.coordinator.metrics import TRACER_RECHECK_S
        with TieredMemory(sys.argv[1], dim=4, embedder=None, device="none") as memory:
            memory.add(["a"], vectors=np.eye(4, dtype=np.float32)[0], namespace="n")
            memory.search(np.eye(4, dtype=np.float32)[0], k=1, namespace="n")  # no provider yet
            exporter = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
            time.sleep(TRACER_RECHECK_S + 0.05)
            memory.search(np.eye(4, dtype=np.float32)[0], k=1, namespace="n")
        print(json.dumps([s.name for s in exporter.get_finished_spans()]))
    """)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["tiered_recall.search"]
