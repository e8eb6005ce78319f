"""Every public name of the package has a docstring: each module, and each class, function and method (and
property) whose name does not start with "_", in tiered_recall/ (tiered_recall/testing/ included) and storage/.
Methods are checked on public classes (nested ones too); a private class's methods are not public names."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _source_files() -> list[Path]:
    """The package's modules, each once: tiered_recall/storage is a link to storage/, walked as storage/ only."""
    package = [p for p in (REPO / "tiered_recall").rglob("*.py")
               if p.relative_to(REPO).parts[:2] != ("tiered_recall", "storage") and "__pycache__" not in p.parts]
    return sorted(package + list((REPO / "storage").glob("*.py")))


def _missing(path: Path) -> list[str]:
    """`file: name` for each public name of one file without a docstring ("module" for the module itself)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    where = path.relative_to(REPO).as_posix()
    out = [] if ast.get_docstring(tree) else [f"{where}: module"]

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if not isinstance(node, _DEFS) or node.name.startswith("_"):
                continue
            name = prefix + node.name
            if not ast.get_docstring(node):
                out.append(f"{where}:{node.lineno}: {name}")
            if isinstance(node, ast.ClassDef):
                visit(node.body, name + ".")

    visit(tree.body, "")
    return out


def test_the_walk_finds_the_package():
    found = {p.relative_to(REPO).as_posix() for p in _source_files()}
    for expected in ("tiered_recall/__init__.py", "tiered_recall/coordinator/memory.py",
                     "tiered_recall/testing/faults.py", "storage/cold_store.py"):
        assert expected in found
    assert not any(name.startswith("tiered_recall/storage/") for name in found)


def test_every_public_name_has_a_docstring():
    missing = [entry for path in _source_files() for entry in _missing(path)]
    assert not missing, f"{len(missing)} public name(s) without a docstring:\n" + "\n".join(missing)
