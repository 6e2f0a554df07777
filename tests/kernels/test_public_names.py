"""The public faces of rope.triton are declared: the package and each of its modules state
``__all__``, a name another module imports from one of them is in that module's ``__all__`` (never a
``_name``), and no module of the package passes 800 lines."""

from __future__ import annotations

import ast
import importlib
import pathlib
import pkgutil

import pytest

import rope.triton

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = pathlib.Path(rope.triton.__file__).parent
MODULES = sorted(info.name for info in pkgutil.iter_modules([str(PACKAGE)]))
# Where the project's Python lives (whatever imports rope.triton's modules).
SOURCES = ("rope", "reference", "properties", "tests", "lab")
MAX_LINES = 800


def _imports_from_triton_modules():
    """(file, line, module, name) of every ``from rope.triton.<module> import name`` in the project."""
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                        and node.module.startswith("rope.triton."):
                    for alias in node.names:
                        yield path.relative_to(ROOT), node.lineno, node.module, alias.name


def test_the_package_states_its_modules():
    assert sorted(rope.triton.__all__) == MODULES


@pytest.mark.parametrize("name", MODULES)
def test_each_module_states_its_public_names(name):
    module = importlib.import_module(f"rope.triton.{name}")
    assert isinstance(getattr(module, "__all__", None), list), f"rope.triton.{name}: no __all__"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    private = [n for n in module.__all__ if n.startswith("_")]
    assert not missing and not private, (missing, private)
    assert len(module.__all__) == len(set(module.__all__)), module.__all__


def test_names_imported_from_the_package_modules_are_public():
    wrong = []
    for path, line, module_name, name in _imports_from_triton_modules():
        module = importlib.import_module(module_name)
        # A name a module defines only on some machines (rope.triton.pdl's, where Triton has PDL)
        # is imported under the same condition: judged where it exists.
        if name.startswith("_") or (hasattr(module, name) and name not in module.__all__):
            wrong.append(f"{path}:{line}: {name} from {module_name}")
    assert not wrong, "imported but not in the module's __all__:\n" + "\n".join(wrong)


@pytest.mark.parametrize("name", MODULES)
def test_no_module_of_the_package_passes_800_lines(name):
    lines = len((PACKAGE / f"{name}.py").read_text().splitlines())
    assert lines <= MAX_LINES, f"rope/triton/{name}.py: {lines} lines (at most {MAX_LINES})"
