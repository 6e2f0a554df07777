"""A failure block says what is wrong with the implementation and nothing of the harness: no
Hypothesis explanation pointing into the harness's lines, no tens-of-lines repr of the drawn case
(both back with -v), and a command that reruns that one test from any directory."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rope.harness.plugin.failures import quiet_notes, rerun_command
from rope.harness.suite import plugin_args
from tests.fresh_runs import fresh_env

# The harness's own machinery, checked on the CPU (subprocess runs pinned to --rope-device cpu): a GPU
# run leaves it to CPU CI unless --rope-cpu-work asks (rope.harness.plugin.selection).
pytestmark = pytest.mark.needs_no_gpu

_CASE_REPR = "Draw 1 (case): RotationCase(spec=RopeSpec(head_size=64,\n  rotary_dim=64,\n  base=10000.0),\n seed=0)"
_EXPLANATION = ("Explanation:\n    These lines were always and only run by failing test cases:\n"
                "        /site-packages/rope/harness/rotation/check.py:326")


def test_quiet_notes_drop_the_explanation_and_fold_draw_reprs_in_groups_too():
    inner = AssertionError("mismatch")
    inner.__notes__ = ["Failing test case: test_x(impl_name='mine', data=data(...))", _CASE_REPR, _EXPLANATION,
                       "Draw 2: 17"]
    group = ExceptionGroup("distinct failures", [inner])
    group.__notes__ = [_EXPLANATION]
    quiet_notes(group)
    assert group.__notes__ == []
    assert inner.__notes__ == ["Failing test case: test_x(impl_name='mine', data=data(...))",
                               "Draw 1 (case): summarized above (case:, spec:); -v prints it whole", "Draw 2: 17"]


def _item(tmp_path: Path, name: str, params: dict, profile: str | None = None):
    options = {"hypothesis_profile": profile}
    config = SimpleNamespace(getoption=lambda option, default=None: options.get(option, default),
                             invocation_params=SimpleNamespace(dir=tmp_path))
    return SimpleNamespace(module=SimpleNamespace(__name__="properties.rotation.test_rotation"), name=name,
                           callspec=SimpleNamespace(params=params), config=config)


def test_the_rerun_command_names_the_module_the_implementation_and_the_device_without_the_round(tmp_path):
    item = _item(tmp_path / "my dir", "test_r[round1-mine:rotate-cpu-bf16]",
                 {"impl_name": "mine:rotate", "device": "cpu", "rope_round": 1}, profile="ci")
    assert rerun_command(item) == (
        f"cd '{tmp_path / 'my dir'}' && pytest -p no:randomly --pyargs "
        f"'properties.rotation.test_rotation::test_r[mine:rotate-cpu-bf16]' --rope-impl mine:rotate "
        f"--rope-device cpu --hypothesis-profile ci")
    step = _item(tmp_path, "test_s[vllm-cpu]", {"positions_impl_name": "vllm", "device": "cpu"})
    assert "--rope-position-step-impl vllm --rope-device cpu" in rerun_command(step)


_BROKEN = '''
import dataclasses

from rope.native import rotate_native


def rotate_always_neox(spec, positions, query, key, cos_sin_cache):
    return rotate_native(dataclasses.replace(spec, is_neox_style=True), positions, query, key, cos_sin_cache)


rotate_always_neox.working_precision = rotate_native.working_precision
'''


def test_a_failure_block_is_quiet_and_its_rerun_command_fails_the_same_test_from_elsewhere(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "neoxkernel.py").write_text(_BROKEN)
    env = fresh_env(keep_pythonpath=False)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(), "-q",
                          "--pyargs", "properties.rotation.test_rotation", "-k",
                          "test_rotation_matches_reference and fp32-chunked3-gptj",
                          "--rope-impl", "neoxkernel:rotate_always_neox", "--rope-device", "cpu"],
                         cwd=user, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1 and "pairing_swapped" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
    assert "Explanation:" not in run.stdout and "RotationCase(" not in run.stdout, run.stdout[-3000:]
    header = "rope-harness: rerun this test (from any directory)"
    assert header in run.stdout, run.stdout[-3000:]
    command = run.stdout.split(header, 1)[1].splitlines()[1]
    assert command.startswith(f"cd {shlex.quote(str(user))} && pytest "), command
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    again = subprocess.run(command.replace("pytest ", f"{shlex.quote(sys.executable)} -m pytest "
                                                      f"{' '.join(plugin_args())} ", 1),
                           shell=True, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 1 and "1 failed" in again.stdout, again.stdout[-3000:] + again.stderr[-2000:]


def test_each_cause_block_carries_its_first_tests_rerun_command():
    from rope.harness import causes
    info = {"test": "::t[x]", "cause": "pairing_swapped", "headline": "swapped", "case_file": "reports/cases/a.json",
            "replay": "rope-harness repro reports/cases/a.json", "rerun": "cd /u && pytest --pyargs 'p.m::t[x]'"}
    groups = causes.group([info])
    assert "    rerun: cd /u && pytest --pyargs 'p.m::t[x]'" in causes.terminal_lines(groups)
    assert "  Rerun the test: `cd /u && pytest --pyargs 'p.m::t[x]'`" in causes.markdown_lines(groups)
