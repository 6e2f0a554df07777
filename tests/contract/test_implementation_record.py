"""One record for an implementation (rope/implementation.py): every declaration a typed field with
its default, read once from a plain function, an adapter or a module:callable, a malformed one a
ValueError naming the implementation and the field; nothing else reads a declaration off a
function."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import rope
from rope.implementation import DECLARATIONS, Implementation
from rope.native import rotate_native
from rope.registry import get_implementation, implementation_record


def _plain(spec, positions, query, key, cos_sin_cache):
    return query, key


def test_a_plain_function_without_declarations_gets_every_default():
    record = Implementation.of("mine", _plain)
    assert record.name == "mine" and record.thing == "rotation" and record.fn is _plain
    assert (record.working_precision, record.angles, record.switch_tokens, record.switch_token_heads) == \
        ("float32", "cache", (), ())
    assert all(getattr(record, f.name) == f.default for f in DECLARATIONS)
    assert record("s", "p", "q", "k", "c") == ("q", "k")            # a record calls its function
    assert Implementation.of("other", record) is record


def test_a_plain_functions_attributes_become_typed_fields():
    def mine(spec, positions, query, key, cos_sin_cache):
        return query, key
    mine.working_precision = "activation"
    mine.switch_tokens = [4096, 64, 64.0]
    mine.families = ["qwen2_vl"]
    mine.supports = lambda spec, dtype, device: device == "cpu"
    record = Implementation.of("mine", mine)
    assert record.working_precision == "activation" and record.switch_tokens == (64, 4096)
    assert record.families == ("qwen2_vl",) and record.supports(None, None, "cpu")


def test_built_ins_adapters_and_import_paths_give_records():
    triton = implementation_record("triton")
    assert triton.unchecked is not None and triton.switch_tokens
    assert implementation_record("rope.native:rotate_native").fn is rotate_native
    assert implementation_record("native", "position_step").thing == "position_step"
    assert rope.Implementation is Implementation


@pytest.mark.parametrize("field, value, message", [
    ("working_precision", "fp8", r"mine\.working_precision='fp8': must be one of \('float32', 'activation'\)"),
    ("angles", "own", r"mine\.angles='own': must be one of"),
    ("switch_tokens", (0,), r"mine\.switch_tokens=\(0,\): must be token counts"),
    ("switch_token_heads", "64", r"mine\.switch_token_heads='64': must be token x head products"),
    ("families", "qwen2_vl", r"mine\.families='qwen2_vl': must be a sequence of family names"),
    ("version", 3, r"mine\.version=3: must be a string"),
    ("backward_defect", True, r"mine\.backward_defect=True: must be a string"),
    ("supports", True, r"mine\.supports=True: must be callable"),
    ("fused_op", "norm_rope", r"mine\.fused_op='norm_rope': must be one of \('qk_norm_rope', 'rope_kv_cache', "),
    ("rounds_normalized", 1, r"mine\.rounds_normalized=1: must be True or False"),
    ("fp8_query", "yes", r"mine\.fp8_query='yes': must be True or False"),
    ("skips_padding_tokens", 0, r"mine\.skips_padding_tokens=0: must be True or False"),
    ("draws", ("1d", "all"), r"mine\.draws=\('1d', 'all'\): must be a sequence of \('1d', 'fp8_cache'"),
])
def test_a_malformed_declaration_names_the_implementation_and_the_field(field, value, message):
    def mine(spec, positions, query, key, cos_sin_cache):
        return query, key
    setattr(mine, field, value)
    with pytest.raises(ValueError, match=message):
        Implementation.of("mine", mine)


def test_get_implementation_refuses_a_malformed_declaration_naming_the_import_path(tmp_path, monkeypatch):
    (tmp_path / "badprecision.py").write_text("def rotate(*a):\n    return a\nrotate.working_precision = 'fp8'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"impl='badprecision:rotate': badprecision:rotate\.working_precision='fp8'"):
        get_implementation("badprecision:rotate")


def test_no_module_reads_a_declaration_off_a_function():
    # Every reader goes through the record: a getattr of a declaration's name anywhere else in the
    # shipped code is a second, unchecked way of reading it.
    names = "|".join(f.name for f in DECLARATIONS)
    pattern = re.compile(rf"getattr\([^,()]+,\s*[\"']({names})[\"']")
    root = Path(rope.__file__).resolve().parent
    offenders = [f"{path.relative_to(root.parent)}:{n}" for path in root.rglob("*.py")
                 if path.name != "implementation.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == [], offenders
