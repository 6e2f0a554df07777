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


# ------------------------------------------------------------------ the commands
# The README's first block (install and check everything; the test command) is what CI runs,
# literally: .ci/run takes its lines from .ci/readme_commands.py.  Every other ```bash block of the
# documents runs here as written, against a user's package mypkg built from the documents' own
# example, with two things added: `<id>` becomes the case file the broken example wrote, and the
# run is bounded to a few tests of the checked thing (-k below), so that the whole set takes
# seconds; `[...]` is the usage notation of an optional part and is left out.
SHELL_BLOCK = re.compile(r"^```bash\n(.*?)^```$", re.M | re.S)
_BOUNDS = {"--position-ids-impl": "test_known_bug_prompts_match",
           "--rope-position-ids-impl": "test_known_bug_prompts_match",
           "--rope-position-step-impl": "test_prepared_positions_match_reference",
           "--position-step-impl": "test_prepared_positions_match_reference",
           "--impl": "known_bug_triggers_match_reference and glm41v",
           "--rope-impl": "known_bug_triggers_match_reference and glm41v"}
_MYPKG = {
    "runner.py": "from rope import get_positions_implementation\n\nprepare = get_positions_implementation('native')\n",
    "model.py": ("import reference\n\n\ndef positions(family, prompt):\n"
                 "    found = reference.prompt_positions(family, prompt)\n    return found.positions, found.delta\n"),
}


def shell_commands(document: str, root: Path = ROOT, *, skip_first: bool = False) -> list[tuple[int, str]]:
    """(line, command) of every ```bash block of a document, comments and blank lines left out."""
    text = (root / document).read_text()
    out = []
    for i, m in enumerate(SHELL_BLOCK.finditer(text)):
        if skip_first and i == 0:
            continue
        first = text.count("\n", 0, m.start()) + 2
        for offset, line in enumerate(m.group(1).splitlines()):
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                out.append((first + offset, command))
    return out


def bounded(command: str, case_id: str | None) -> list[str]:
    """The command as the doc-test runs it: placeholders filled, optional parts dropped, bounded."""
    import shlex
    # Optional parts: a GPU's are left out (none here), the others kept.
    text = re.sub(r"\s*\[--device [^\]]*\]", "", command)
    text = re.sub(r"\[([^\]]*)\]", r"\1", text)
    if case_id is not None:
        text = text.replace("<id>", case_id)
    words = shlex.split(text)
    bound = next((_BOUNDS[w] for w in words if w in _BOUNDS), None)
    if any(w.startswith("--rope-repro") for w in words):
        bound = None                     # a replay runs its case files' tests only
    if bound and words[:2] == ["rope-harness", "check"]:
        words += ["--", "-k", bound] if "--" not in words else ["-k", bound]
    elif bound and words[0] == "pytest":
        words += ["-k", bound]
    return words


def _mypkg(tmp_path: Path) -> Path:
    package = tmp_path / "site" / "mypkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    example = (ROOT / "docs/implementations.md").read_text().split("## A complete example", 1)[1]
    rope_py = BLOCK.search(example).group(2)
    (package / "rope.py").write_text(rope_py + "\nfn = fixed = rotate\n")
    for name, code in _MYPKG.items():
        (package / name).write_text(code)
    (package / "positions.py").write_text(_MYPKG["model.py"])
    return tmp_path / "site"


@pytest.mark.slow
@pytest.mark.needs_no_gpu
def test_the_documents_commands_run_as_written(tmp_path):
    import os
    import shutil
    import subprocess
    import sys

    from rope.harness.suite import subprocess_env
    if shutil.which("rope-harness") is None and not (Path(sys.executable).parent / "rope-harness").exists():
        pytest.skip("rope-harness is not installed as a command here (pip install -e .)")
    site = _mypkg(tmp_path)
    work = tmp_path / "user"
    (work / "properties" / "regressions").mkdir(parents=True)     # the cp line's target, as in a checkout
    env = {k: v for k, v in subprocess_env().items() if not k.startswith(("ROPE_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("TRITON_INTERPRET", None)
    # `-n auto` (and `rope-harness check`, which passes it) as written, but one worker each: the
    # suite's own workers hold the cores (16 more per command on a GPU host, each importing torch
    # and initialising the device to run a few tests, took this test past 240 s), and on CI's 2
    # cores a second worker per command cost 29 s of CPU time (150 -> 121 s) for no coverage.
    env["PYTEST_XDIST_AUTO_NUM_WORKERS"] = "1"
    case_id, ran = None, []
    for document in ("docs/implementations.md", "README.md"):
        for line, command in shell_commands(document, skip_first=document == "README.md"):
            words = bounded(command, case_id)
            if words[0] == "pytest":
                words = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *words[1:]]
            run = subprocess.run(words, cwd=work, env=env, capture_output=True, text=True, timeout=600)
            said = f"{document}:{line}: {command}\n(ran {words})\n" + run.stdout[-3000:] + run.stderr[-3000:]
            if "rotate_always_neox" in command:          # the documented broken example
                assert run.returncode == 1 and "pairing_swapped" in run.stdout, said
                case_id = sorted((work / "reports" / "cases").glob("*.json"))[0].stem
            else:
                assert run.returncode == 0, said
            ran.append(command)
    assert len(ran) >= 10, ran


def test_a_command_is_bounded_and_its_placeholders_filled():
    assert bounded("rope-harness repro reports/cases/<id>.json [--device cuda] [--impl mypkg.rope:fixed]", "c1") == \
        ["rope-harness", "repro", "reports/cases/c1.json", "--impl", "mypkg.rope:fixed"]
    assert bounded("pytest -n 2 --pyargs properties --rope-impl mypkg.rope:fn", None)[-2:] == \
        ["-k", "known_bug_triggers_match_reference and glm41v"]
    assert bounded("rope-harness check --position-ids-impl m:p", None)[-3:] == \
        ["--", "-k", "test_known_bug_prompts_match"]


def test_ci_runs_the_readmes_commands_as_written():
    # The second line as written; the first line's install as written and its check on the table (its
    # property tests are the second line's: .ci/run says why), so the first line must end in the check.
    import subprocess
    import sys
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'bash -c "$(python3 .ci/readme_commands.py 2)' in ci
    assert 'first_line="$(python3 .ci/readme_commands.py 1)"' in ci and 'bash -c "$install"' in ci
    assert '.venv/bin/rope-harness check --table-impl ours' in ci
    lines = [subprocess.run([sys.executable, str(ROOT / ".ci" / "readme_commands.py"), n], capture_output=True,
                            text=True, check=True).stdout.strip() for n in ("1", "2")]
    assert lines[0].endswith(" && .venv/bin/rope-harness check") and lines[1].endswith("pytest -n auto"), lines
