"""The registry (rope/registry.py): an unknown name or an import path that is no implementation is a
clear ValueError, never an ImportError or a crash; a good path resolves to its callable; an
implementation's declared switch points are checked the same way."""

from __future__ import annotations

import re
import sys

import pytest

from rope.registry import get_implementation, switch_token_heads, switch_tokens


def test_unknown_implementation_is_a_clear_error():
    with pytest.raises(ValueError, match=r"impl='nope': not a registered name \([^)]*native[^)]*triton[^)]*\)"):
        get_implementation("nope")
    with pytest.raises(ValueError, match=r"impl='no_such_pkg:fn': cannot import module"):
        get_implementation("no_such_pkg:fn")
    with pytest.raises(ValueError, match=r"has no attribute 'missing'"):
        get_implementation("rope.native:missing")


@pytest.mark.parametrize("target, message", [
    ("rope:RopeSpec", r"'RopeSpec' is a type, not an implementation"),               # a class
    ("builtins:eval", r"'eval' is a builtin_function_or_method, not an implementation"),
    ("os:system", r"'system' is a builtin_function_or_method"),
    ("sys:exit", r"'exit' is a builtin_function_or_method"),
    ("rope.native:__class__", r"no private or dunder attributes"),
    ("rope.native:rotate_native.__globals__", r"no private or dunder attributes"),
    ("rope.spec:_check_index_vector", r"no private or dunder attributes"),
    ("..x:f", r"'\.\.x' is not an absolute module name"),
    ("rope.spec:LAYOUTS", r"'LAYOUTS' is a tuple, not an implementation"),
    ("rope:spec", r"'spec' is a module, not an implementation"),
])
def test_import_paths_that_are_no_implementation_are_refused(target, message):
    with pytest.raises(ValueError, match=rf"impl={re.escape(repr(target))}: .*{message}"):
        get_implementation(target)


def test_any_import_failure_is_a_value_error(tmp_path, monkeypatch):
    # Whatever a module raises while it imports (not only ImportError) names the target.
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, body, raised in (("broken_syntax", "def f(:\n", "SyntaxError"),
                               ("raises_at_import", "raise RuntimeError('boom')\n", "RuntimeError"),
                               ("exits_at_import", "import sys\nsys.exit(3)\n", "SystemExit")):
        (tmp_path / f"{name}.py").write_text(body)
        with pytest.raises(ValueError, match=rf"impl='{name}:f': cannot import module '{name}' "
                                             rf"\(.*{name}\.py\): it raised {raised}"):
            get_implementation(f"{name}:f")


def test_a_module_in_the_current_directory_imports_without_pythonpath(tmp_path, monkeypatch):
    # As python -m does: `--impl here_kernel:rotate` run beside here_kernel.py needs no PYTHONPATH,
    # and the module's own import of a neighbour works too.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here_helper.py").write_text("def rotate(spec, positions, query, key, cache):\n    return query, key\n")
    (tmp_path / "here_kernel.py").write_text("from here_helper import rotate\n")
    try:
        assert get_implementation("here_kernel:rotate").__module__ == "here_helper"
        assert sys.path[0] == str(tmp_path)
    finally:
        sys.modules.pop("here_kernel", None)
        sys.modules.pop("here_helper", None)


def test_a_module_not_found_is_one_line_naming_the_directories_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as raised:
        get_implementation("not_here_kernel:rotate")
    message = str(raised.value)
    assert "\n" not in message
    assert f"no 'not_here_kernel' in the current directory ({tmp_path})" in message
    assert "site-packages" in message                      # the rest of sys.path, searched after it
    assert "run from the directory holding not_here_kernel.py" in message and "PYTHONPATH" in message


def test_a_found_module_whose_own_import_fails_names_that_import(tmp_path, monkeypatch):
    # Not "no module named mine": mine is there, what it imports is not.
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "needs_dep_kernel.py").write_text("import no_such_dependency_xyz\n")
    with pytest.raises(ValueError, match=r"cannot import module 'needs_dep_kernel' \(.*needs_dep_kernel\.py\): it raised "
                                         r"ModuleNotFoundError: No module named 'no_such_dependency_xyz'"):
        get_implementation("needs_dep_kernel:rotate")


def test_import_path_resolves_to_the_callable():
    assert get_implementation("rope.native:rotate_native") is get_implementation("native")


@pytest.mark.parametrize("attribute", ["switch_tokens", "switch_token_heads"])
@pytest.mark.parametrize("declared", [(0,), ("64",), (1.5,), (True,), (2**31 + 1,), 5], ids=repr)
def test_a_malformed_switch_declaration_is_a_value_error_naming_it(attribute, declared):
    def mine(spec, positions, query, key, cache):
        return query, key
    setattr(mine, attribute, declared)
    with pytest.raises(ValueError, match=rf"^mine\.{attribute}="):
        (switch_tokens if attribute == "switch_tokens" else switch_token_heads)("mine", mine)
    setattr(mine, attribute, (4096, 10240))
    assert (switch_tokens if attribute == "switch_tokens" else switch_token_heads)("mine", mine) == (4096, 10240)
