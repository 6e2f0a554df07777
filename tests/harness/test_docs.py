"""The documents' code runs as written: every ```python block of README.md and
docs/implementations.md, in order, each file's blocks in one namespace (a later block may build on
an earlier one), on the CPU.  A block fenced ```python no-run is an illustration that needs what
this machine cannot have (an engine's own processor) and is only compiled."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/implementations.md")
BLOCK = re.compile(r"^```python( no-run)?\n(.*?)^```$", re.M | re.S)


def python_blocks(document: str, root: Path = ROOT) -> list[tuple[int, bool, str]]:
    """(line, runs, code) of every python block of a document."""
    text = (root / document).read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1) is None, m.group(2)) for m in BLOCK.finditer(text)]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_the_documents_python_blocks_run_as_written(document, monkeypatch, tmp_path):
    blocks = python_blocks(document)
    assert blocks, f"{document}: no python block found"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"doc_{Path(document).stem}"}
    for line, runs, code in blocks:
        compiled = compile(code, f"{document}:{line}", "exec")
        if runs:
            exec(compiled, namespace)        # noqa: S102 - the project's own documents


def test_a_block_that_does_not_run_fails_the_doc_test(tmp_path):
    # The control: the README's example before it named its inputs (positions, query, key undefined).
    broken = "```python\nimport torch\nq = positions + 1\n```\n"
    (tmp_path / "README.md").write_text(broken)
    code = python_blocks("README.md", tmp_path)[0][2]
    with pytest.raises(NameError, match="positions"):
        exec(compile(code, "README.md", "exec"), {})   # noqa: S102
