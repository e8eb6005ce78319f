"""What the HTTP tests share: the store's width, the tokens, vectors, and a uvicorn server on a free port in a thread."""
from __future__ import annotations

import socket
import threading
import time

import numpy as np

from tiered_recall.http import HttpSettings, TokenScope

DIM = 8
ADMIN = "admin-token-0123456789abcdef"
ALICE = "alice-token-0123456789abcdef"  # scoped to ["users", "alice"]
# TestClient's requests name the host "testserver"; a server bound to loopback takes only the names listed.
TEST_HOSTS = ("testserver", "localhost", "127.0.0.1")


def unit(i: int, dim: int = DIM) -> list[float]:
    """The i-th axis as a vector (a memory's direction, distinct for i < dim)."""
    v = np.zeros(dim, dtype=np.float32)
    v[i % dim] = 1.0
    return v.tolist()


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def scoped_settings(**more) -> HttpSettings:
    """An admin token for the whole store and alice's for ["users", "alice"]."""
    return HttpSettings(tokens={ADMIN: TokenScope(), ALICE: TokenScope.of(["users", "alice"])},
                        allowed_hosts=TEST_HOSTS, **more)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LiveServer:
    """The app served by uvicorn on 127.0.0.1 in a thread (stopped by stop())."""

    def __init__(self, app) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)




def stop_sidecar(memory) -> None:
    """Stops the sidecar a closed store started, if it still runs (the conftest's stop_sidecar_after, for a store
    that outlives one test)."""
    import os
    import signal

    from tiered_recall import hot

    if hot.segment_path(memory.sidecar_name).exists():
        try:
            with hot.HotTier.attach(memory.sidecar_name) as tier:
                os.kill(tier.owner_pid, signal.SIGTERM)
        except Exception:
            pass  # gone meanwhile: it exits by itself once orphaned
