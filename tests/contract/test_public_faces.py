"""Public faces: every package of the shipped code (rope/, reference/, properties/) states what it
hands on in ``__all__``, each entry a name it defines or a module it holds; no module of the shipped
code or of the project's tests imports another module's ``_private`` name (a name used across modules
is public); and no module imports a test module (shared helpers and cases live in case modules)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("rope", "reference", "properties")
# Where a name used across modules must be public: the shipped code and the project's tests.
CHECKED = (*SHIPPED, "tests")
PACKAGES = sorted(str(p.parent.relative_to(ROOT)).replace("/", ".") for top in SHIPPED
                  for p in (ROOT / top).rglob("__init__.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_states_its_public_names(package):
    init = ROOT / package.replace(".", "/") / "__init__.py"
    tree = ast.parse(init.read_text())
    stated = [node for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
              and any(getattr(t, "id", None) == "__all__" for t in getattr(node, "targets", [getattr(node, "target", None)]))]
    assert stated, f"{init.relative_to(ROOT)}: no __all__"
    try:
        names = ast.literal_eval(stated[0].value)
    except ValueError:                 # computed (sorted(...)): the package's own value
        names = importlib.import_module(package).__all__
    directory = init.parent
    missing = [n for n in names if not ((directory / f"{n}.py").exists() or (directory / n / "__init__.py").exists()
                                        or n in _defined(tree))]
    if missing:      # defined lazily (rope/__init__.py's PEP 562 names): ask the package
        module = importlib.import_module(package)
        missing = [n for n in missing if not hasattr(module, n)]
    assert missing == [], f"{package}.__all__ names what it does not have: {missing}"


def _defined(tree: ast.Module) -> set[str]:
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
    return out


def _modules(tops=CHECKED):
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path, ast.parse(path.read_text())


def test_no_module_imports_a_private_name_of_another():
    offenders = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in CHECKED:
                offenders += [f"{path.relative_to(ROOT)}: from {node.module} import {a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert offenders == [], offenders


def _is_test_module(dotted: str) -> bool:
    """Whether ``dotted`` names a test module of this tree (``test_*.py``, by its last part)."""
    *package, last = dotted.split(".")
    return last.startswith("test_") and (ROOT.joinpath(*package, f"{last}.py")).exists()


def test_no_module_imports_a_test_module():
    # A test module is collected, not imported: what two of them share (cases, helpers, constants)
    # lives in a case module beside them (properties/rotation/aliasing.py, tests/fresh_runs.py, ...).
    offenders = []
    for path, tree in _modules((*CHECKED, "lab")):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in CHECKED:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.split(".")[0] in CHECKED]
            else:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names if _is_test_module(name)]
    assert offenders == [], offenders
