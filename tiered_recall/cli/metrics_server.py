"""`tiered-recall serve --metrics-port`: the sidecar as a child process, and the store's Prometheus metrics (every
process of the store added up) served over HTTP until the sidecar exits."""
from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from .output import fail, note


def serve_with_metrics(sidecar_args: list[str], store: Path, port: int) -> int:
    """Runs the sidecar until it exits (Ctrl-C and SIGTERM are passed on to it) while serving the metrics of
    `store` on port; returns the sidecar's exit status."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as error:
        fail(f"--metrics-port needs prometheus-client ({error}): pip install \"tiered-recall[metrics]\"")
    from ..coordinator.metrics import StoreCollector

    registry = CollectorRegistry()
    registry.register(StoreCollector(Path(store).expanduser().resolve()))
    try:
        server, thread = start_http_server(port, registry=registry)
    except OSError as error:
        fail(f"cannot serve metrics on port {port}: {error}; choose another with --metrics-port")
    note(f"metrics of {store} on http://0.0.0.0:{port}/metrics")
    child = subprocess.Popen(sidecar_args)

    def pass_on(signum, frame) -> None:
        child.send_signal(signum)

    previous = {s: signal.signal(s, pass_on) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        server.shutdown()
