"""How long a new process waits before a store answers: `TieredMemory(path)` to its first text search returned, the
CLI's `search` wall time, `--help` and a bad-input error, each in a fresh process, beside the peer's open in the same
run (`import lancedb` alone, and `import chromadb` with a `PersistentClient` opened where chromadb is installed).
Medians of --runs alternated rounds; the store holds --memories memories of one namespace, made once with the
default (quality) preset.

    python benchmarks/open_time.py                      # 5 rounds, 2,000 memories
    python benchmarks/open_time.py --runs 9 --json experiments/open-time.json
    python benchmarks/open_time.py --chroma-python /path/to/a/venv/with/chromadb/bin/python

Chroma's default embedder fetches its model from the internet on first use, which this benchmark's machines cannot:
the peer's row is its import and a PersistentClient with one collection opened, without the embedder's load.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = str(Path(sys.executable).parent / "tiered-recall")

FIRST_SEARCH = """
import sys, time, json
t0 = time.perf_counter()
from tiered_recall import TieredMemory
memory = TieredMemory(sys.argv[1])
opened = time.perf_counter()
hits = memory.search("what does Ana eat?", k=5, namespace="chat")
searched = time.perf_counter()
hits = memory.search("when is the review?", k=5, namespace="chat")
second = time.perf_counter()
memory.close()
print(json.dumps({"open_s": opened - t0, "first_search_s": searched - opened, "to_first_search_s": searched - t0,
                  "second_search_s": second - searched, "hits": len(hits)}))
"""

PEER_LANCEDB = "import lancedb"
PEER_CHROMA = """
import sys, chromadb
client = chromadb.PersistentClient(path=sys.argv[1])
client.get_or_create_collection("chat")
"""


def wall(command: list[str], env: dict, cwd: str) -> tuple[float, subprocess.CompletedProcess]:
    """Seconds from the start of a process to its exit, and what it printed."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    return time.perf_counter() - started, done


def make_store(path: Path, memories: int, env: dict, cwd: str) -> None:
    """A store of `memories` short chat turns in namespace "chat" (the default preset), its sidecar stopped."""
    script = f"""
import sys
from tiered_recall import TieredMemory
with TieredMemory(sys.argv[1]) as memory:
    topics = ["Ana is vegetarian", "the review moved to the 21st", "my cat is called Miso", "we fly to Porto in May",
              "the build takes four minutes", "Bo plays the cello", "the lease ends in March", "tea, not coffee"]
    texts = [f"{{topics[i % len(topics)]}} (note {{i}})" for i in range({memories})]
    for lo in range(0, len(texts), 500):
        memory.add(texts[lo:lo + 500], namespace="chat", ids=list(range(lo + 1, lo + 1 + len(texts[lo:lo + 500]))))
"""
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"could not make the store:\n{done.stderr}")
    subprocess.run([CLI, "stats", "--store", str(path)], capture_output=True, env=env, cwd=cwd)  # settles the folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="alternated rounds (default 5)")
    parser.add_argument("--memories", type=int, default=2000, help="memories in the store (default 2,000)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--chroma-python", default=None,
                        help="a Python with chromadb installed, for the peer's row (default: this one, if it has it)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="tr-open-time-")
    env = {**os.environ, "XDG_DATA_HOME": os.path.join(work, "data"), "PYTHONUNBUFFERED": "1"}
    store = Path(work) / "store"
    try:
        make_store(store, args.memories, env, work)
        chroma_python = args.chroma_python or sys.executable
        chroma = subprocess.run([chroma_python, "-c", "import chromadb"], capture_output=True, env=env,
                                cwd=work).returncode == 0
        if args.chroma_python and not chroma:
            raise SystemExit(f"--chroma-python {args.chroma_python} cannot import chromadb: give a Python that has it")
        rows: dict[str, list[float]] = {}

        def note(name: str, seconds: float) -> None:
            rows.setdefault(name, []).append(seconds)

        for _ in range(args.runs):
            seconds, done = wall([sys.executable, "-c", FIRST_SEARCH, str(store)], env, work)
            if done.returncode != 0:
                raise SystemExit(done.stderr)
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            note("TieredMemory(path) to its first text search (in process)", figures["to_first_search_s"])
            note("  of which the open", figures["open_s"])
            note("  of which the first search", figures["first_search_s"])
            note("  the second search", figures["second_search_s"])
            note("the same, the whole process", seconds)
            note("CLI search, wall", wall([CLI, "search", "what does Ana eat?", "-n", "chat", "-k", "5", "--store",
                                          str(store)], env, work)[0])
            note("CLI --help, wall", wall([CLI, "--help"], env, work)[0])
            note("CLI search -k 0 (bad input), wall", wall([CLI, "search", "x", "-k", "0", "--store", str(store)],
                                                          env, work)[0])
            note("CLI ingest of a missing file (bad input), wall",
                 wall([CLI, "ingest", os.path.join(work, "missing.jsonl"), "--store", str(store)], env, work)[0])
            note("peer: import lancedb, wall", wall([sys.executable, "-c", PEER_LANCEDB], env, work)[0])
            if chroma:
                note("peer: import chromadb + PersistentClient, wall",
                     wall([chroma_python, "-c", PEER_CHROMA, os.path.join(work, "chroma")], env, work)[0])
        medians = {name: statistics.median(values) for name, values in rows.items()}
        width = max(len(name) for name in medians)
        print(f"{'':{width}}  median s  (min - max over {args.runs} rounds)")
        for name, values in rows.items():
            print(f"{name:{width}}  {medians[name]:7.3f}  ({min(values):.3f} - {max(values):.3f})")
        if not chroma:
            print("(chromadb is not installed here: the peer is import lancedb alone)")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"machine": platform.node(), "cores": os.cpu_count(), "runs": rows,
                                             "medians": medians}, indent=1))
    finally:
        subprocess.run([CLI, "stats", "--store", str(store)], capture_output=True, env=env, cwd=work)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
