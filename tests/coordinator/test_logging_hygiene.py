"""Using the store leaves the application's logging as it was: the root logger keeps its level and handlers, and the
package logs only under the `tiered_recall` logger."""
from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "tiered_recall"

# What a host application does: import the store, embed with the default embedder (WordLlama, whose import calls
# logging.basicConfig(level=INFO)), search, and import FAISS afterwards (its loader logs at INFO).
_HOST_APPLICATION = textwrap.dedent("""
    import json, logging, sys
    root = logging.getLogger()
    before = {"level": root.level, "handlers": [repr(h) for h in root.handlers]}

    import tiered_recall
    from tiered_recall import TieredMemory
    with TieredMemory(sys.argv[1], device="none") as memory:
        memory.add(["Ana is vegetarian", "The review moved to the 21st"], namespace="alice")
        hits = memory.search("what does Ana eat?", namespace="alice", k=1)
    import faiss  # noqa: F401

    after = {"level": root.level, "handlers": [repr(h) for h in root.handlers]}
    print(json.dumps({"before": before, "after": after, "top": hits[0].text}))
""")


@pytest.mark.lancedb
def test_the_store_leaves_the_root_logger_as_it_was(tmp_path: pathlib.Path) -> None:
    done = subprocess.run([sys.executable, "-c", _HOST_APPLICATION, str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["top"] == "Ana is vegetarian"
    assert report["after"] == report["before"], "the root logger's level or handlers changed"
    assert "INFO" not in done.stderr, f"INFO lines reached the application's stderr:\n{done.stderr}"


def _logger_calls(tree: ast.AST) -> list[str]:
    """Every call that logs through or configures the root logger: logging.basicConfig, logging.info(...) and the
    like, logging.getLogger() with no name."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if not (isinstance(node.func.value, ast.Name) and node.func.value.id == "logging"):
            continue
        name = node.func.attr
        if name in {"basicConfig", "debug", "info", "warning", "error", "exception", "critical", "log"}:
            found.append(f"logging.{name} at line {node.lineno}")
        elif name == "getLogger":
            if not node.args:
                found.append(f"logging.getLogger() at line {node.lineno}")
            elif isinstance(node.args[0], ast.Constant) and not str(node.args[0].value).startswith("tiered_recall"):
                found.append(f"logging.getLogger({node.args[0].value!r}) at line {node.lineno}")
    return found


def test_the_package_logs_only_under_its_own_logger() -> None:
    offenders = []
    for source in sorted(PACKAGE.rglob("*.py")):
        for call in _logger_calls(ast.parse(source.read_text(), filename=str(source))):
            offenders.append(f"{source.relative_to(PACKAGE.parent)}: {call}")
    allowed = (
        # embedders._root_logger_kept reaches the root logger to put it back as it was
        "tiered_recall/embedders/wordllama.py: logging.getLogger()",
        # serve(log_file=...) runs the MCP server as the process itself: its log file is the process's logging
        "tiered_recall/integrations/mcp_server.py: logging.basicConfig",
        # the test parts quiet the test S3 server's per-request lines; applications never import them
        "tiered_recall/testing/cluster_parts.py: logging.getLogger('werkzeug')",
    )
    assert [line for line in offenders if not line.startswith(allowed)] == []
