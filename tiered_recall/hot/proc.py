"""Process liveness checks shared by the client and the coordinator."""
from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True when process pid exists and is not a zombie (a pid we may not signal counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    # a zombie (killed, not yet reaped by its parent) still answers kill(pid, 0)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True
