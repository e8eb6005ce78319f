"""The dependency rules that import-linter cannot see: nothing imports a benchmark script, benchmarks import no test
module, and no file puts benchmarks/ or tests/ on sys.path (what both share lives in tiered_recall/testing). The
package's own layering is import-linter's job (`lint-imports`, run by .ci/run; contracts in pyproject.toml)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = {p.stem for p in (REPO / "benchmarks").glob("*.py")}
TEST_MODULES = {p.stem for p in (REPO / "tests").rglob("*.py")}


def _python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def _sys_path_edits(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("insert", "append"):
            target = ast.unparse(node.func.value)
            if target == "sys.path":
                out.append((node.lineno, ast.unparse(node)))
    return out


def test_nothing_imports_a_benchmark():
    offenders = []
    for path in _python_files("tiered_recall", "storage", "tests", "benchmarks"):
        for line, module in _imports(path):
            top = module.split(".")[0]
            if top == "benchmarks" or (top in BENCHMARKS and top not in ("tiered_recall",)):
                offenders.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert not offenders, "\n".join(offenders)


def test_benchmarks_and_the_package_import_no_test_module():
    offenders = []
    for path in _python_files("tiered_recall", "storage", "benchmarks"):
        for line, module in _imports(path):
            top = module.split(".")[0]
            if top in ("tests", "conftest") or (top in TEST_MODULES and top.startswith("test_")):
                offenders.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert not offenders, "\n".join(offenders)


def test_no_file_puts_benchmarks_or_tests_on_sys_path():
    offenders = []
    for path in _python_files("tiered_recall", "storage", "tests", "benchmarks"):
        for line, call in _sys_path_edits(path):
            offenders.append(f"{path.relative_to(REPO)}:{line} {call}")
    assert not offenders, "\n".join(offenders)
