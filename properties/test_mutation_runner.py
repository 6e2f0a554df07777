"""The mutation runner's own logic (rope/mutation.py): reading pytest's output, the mutant list
and the suites each mutant runs, the parent control that tells a catch from a false alarm, the
reports; and one real run on one fast mutant."""

from __future__ import annotations

import contextlib
import importlib
import json
import pkgutil

import pytest

from rope.harness import mutation
from rope.harness.mutation import Mutant, MutationRunner, RawRun, Stage, parse_pytest_output

# Trimmed from real runs (pytest -x -v --tb=short), kept byte for byte where it matters.
KEY_UNROTATED = "properties.mutants.broken_rotations:key_unrotated"
ROTATION_FAILURE = f"""\
============================= test session starts ==============================
collecting ... collected 54 items

properties/test_rotation.py::test_rotation_matches_reference[{KEY_UNROTATED}-cpu-fp32-1d-neox] FAILED [  1%]

=================================== FAILURES ===================================
_ test_rotation_matches_reference[{KEY_UNROTATED}-cpu-fp32-1d-neox] _
properties/test_rotation.py:31: in test_rotation_matches_reference
    assert_matches_reference(impl_name, impl, case, device)
E   AssertionError: {KEY_UNROTATED} on cpu does not match the reference (case 2e5a0c12626956cb)
E   diagnosis: key_only: only the key is wrong, it comes back exactly as it went in (never rotated)
E   Mismatched elements: 64 / 128 (50.0%)
E   Worst error/bound: 6.3e+07
E     key[token 0, head 0, channel 17] (freq 17 member a): got -0.838315368, expected 0.128674943
E   case: RotationCase(spec=RopeSpec(head_size=64, rotary_dim=64, is_neox_style=True), num_tokens=1, seed=0)
E   case file: not written (ROPE_CASES_DIR='off')
E   Failing test case: test_rotation_matches_reference(
E       impl_name='{KEY_UNROTATED}',
E       data=data(...),
E   )
E   Draw 1 (case): RotationCase(spec=RopeSpec(head_size=64,
E    seed=0)
E   Explanation:
E       These lines were always and only run by failing test cases:
E           /work/main/rope/spec.py:243
E   
E   You can reproduce this test case by temporarily adding @reproduce_failure('6.170.17', b'AXicc2RwREBGEAYzgQgALOADDw==') as a decorator on your test function
=========================== short test summary info ============================
FAILED properties/test_rotation.py::test_rotation_matches_reference[{KEY_UNROTATED}-cpu-fp32-1d-neox]
!!!!!!!!!!!!!!!!!!!!!!!!!! stopping after 1 failures !!!!!!!!!!!!!!!!!!!!!!!!!!!
============================== 1 failed in 0.99s ===============================
"""

DELTA_PER_CHUNK = "properties.mutants.broken_positions:delta_per_chunk"
STATEFUL_FAILURE = f"""\
properties/test_runner_positions.py::test_chunked_prefill_concatenates_to_prompt_then_decodes_with_delta PASSED [  5%]
properties/test_scheduler_positions.py::test_scheduler_positions_match_whole_sequence[{DELTA_PER_CHUNK}-cpu-qwen2_vl] FAILED [ 81%]

=================================== FAILURES ===================================
_ test_scheduler_positions_match_whole_sequence[{DELTA_PER_CHUNK}-cpu-qwen2_vl] _
properties/test_scheduler_positions.py:148: in step
    assert torch.equal(got[:, :num_tokens], expected), (
E   AssertionError: step 2: prepared positions [[3], [3], [3]] != whole-sequence positions [[2], [2], [2]]
E   assert False
E    +  where False = <built-in method equal of type object at 0x7ff68accea40>(tensor([[3]]), tensor([[2]]))
E   Failing test case: <state machine>
E   state = Scheduler()
E   state.add_request(data=data(...), max_new=1, prompt=Prompt(tuple([Text(length=2)])), seed=0)
E   state.step(budget=1, data=data(...))
E   state.teardown()
E   Explanation:
E       These lines were always and only run by failing test cases:
=========================== short test summary info ============================
FAILED properties/test_scheduler_positions.py::test_scheduler_positions_match_whole_sequence[{DELTA_PER_CHUNK}-cpu-qwen2_vl]
!!!!!!!!!!!!!!!!!!!!!!!!!! stopping after 1 failures !!!!!!!!!!!!!!!!!!!!!!!!!!!
================== 1 failed, 20 passed in 36.77s ===================
"""

STORE_UNMASKED = "properties.mutants.kernel:positions_store_unmasked"
CRASH = f"""\
collecting ... collected 26 items

properties/test_runner_positions.py::test_prepared_positions_match_reference[{STORE_UNMASKED}-cpu] Fatal Python error: Segmentation fault

Current thread 0x00007fe1afbc4b80 (most recent call first):
  File "/work/main/.venv/lib/python3.11/site-packages/triton/runtime/interpreter.py", line 1465 in _from_cpu
"""

DEDICATED_PASS = f"""\
properties/test_dispatch.py::test_dispatch_property_rejects_broken_op[mrope_cached_cos_sin] PASSED [100%]

==================================== PASSES ====================================
________ test_dispatch_property_rejects_broken_op[mrope_cached_cos_sin] ________
----------------------------- Captured stdout call -----------------------------
{mutation.MARK} AssertionError:
AssertionError: MRopeCachedCosSin platform=xpu mode=eager on cpu: forward_xpu does not match the reference
case: RotationCase(spec=RopeSpec(head_size=64, rotary_dim=64), num_tokens=1, seed=0)
Failing test case: dispatch_matches_reference(
    combo=('mrope-chunked', 'xpu', 'eager'),
    data=data(...),
)
Draw 1 (case): RotationCase(spec=RopeSpec(head_size=64,
 seed=0)
{mutation.MARK_END}
=========================== short test summary info ============================
PASSED properties/test_dispatch.py::test_dispatch_property_rejects_broken_op[mrope_cached_cos_sin]
============================== 1 passed in 1.98s ===============================
"""


# --------------------------------------------------------------------------- parsing
def test_parse_failure_gives_test_duration_assertion_and_example():
    out = parse_pytest_output(ROTATION_FAILURE)
    node = f"properties/test_rotation.py::test_rotation_matches_reference[{KEY_UNROTATED}-cpu-fp32-1d-neox]"
    assert out.failed == [node] and out.ran == [node] and out.errors == []
    assert out.pytest_s == 0.99 and out.summary == "1 failed" and out.counts == {"failed": 1}
    assert out.assertion[0] == (f"AssertionError: {KEY_UNROTATED} on cpu does not match the reference "
                                "(case 2e5a0c12626956cb)")
    assert out.assertion[-1] == "case file: not written (ROPE_CASES_DIR='off')"
    assert out.falsifying[0] == "Failing test case: test_rotation_matches_reference("
    assert out.falsifying[-1] == " seed=0)"            # up to Hypothesis' explanation, which is left out
    assert not any("Explanation" in line or "reproduce" in line for line in out.falsifying)
    text = mutation.excerpt(out.assertion, out.falsifying)
    assert text.splitlines() == [f"{KEY_UNROTATED} on cpu does not match the reference (case 2e5a0c12626956cb)",
                                 "case: RotationCase(spec=RopeSpec(head_size=64, rotary_dim=64, is_neox_style=True), "
                                 "num_tokens=1, seed=0)"]


def test_parse_stateful_failure_keeps_the_steps_and_drops_assert_rewriting():
    out = parse_pytest_output(STATEFUL_FAILURE)
    assert out.pytest_s == 36.77 and out.counts == {"failed": 1, "passed": 20}
    assert len(out.ran) == 2 and out.failed[0].endswith(f"[{DELTA_PER_CHUNK}-cpu-qwen2_vl]")
    assert out.assertion == ["AssertionError: step 2: prepared positions [[3], [3], [3]] != whole-sequence "
                             "positions [[2], [2], [2]]"]
    assert out.falsifying[:2] == ["Failing test case: <state machine>", "state = Scheduler()"]
    assert out.falsifying[-1] == "state.teardown()"
    assert mutation.excerpt(out.assertion, out.falsifying).splitlines()[1] == (
        "state.step(budget=1, data=data(...))")


def test_parse_crash_names_the_test_that_was_running():
    out = parse_pytest_output(CRASH)
    assert out.crash == "Fatal Python error: Segmentation fault"
    assert out.crash_node == ("properties/test_runner_positions.py::test_prepared_positions_match_reference"
                              f"[{STORE_UNMASKED}-cpu]")
    assert out.failed == [] and out.ran == [] and out.pytest_s is None


def test_parse_dedicated_pass_reads_what_pytest_raises_caught():
    out = parse_pytest_output(DEDICATED_PASS)
    assert out.failed == [] and out.counts == {"passed": 1} and out.pytest_s == 1.98
    assert out.assertion[0].startswith("AssertionError: MRopeCachedCosSin platform=xpu")
    assert out.falsifying[1] == "    combo=('mrope-chunked', 'xpu', 'eager'),"
    assert mutation.excerpt(out.assertion, out.falsifying).splitlines()[1].startswith("case: RotationCase(")
    assert out.falsifying[-1] == " seed=0)"


def test_echo_plugin_prints_what_pytest_raises_caught(capsys):
    original = pytest.raises
    hook = mutation.pytest_runtest_call(item=None)
    next(hook)
    try:
        assert pytest.raises is not original
        with pytest.raises(ValueError, match="bad"):
            raise ValueError("bad input")
        with pytest.raises(KeyError):          # nothing echoed for what is not raised ... and still checked
            {}["missing"]
    finally:
        with contextlib.suppress(StopIteration):
            hook.send(None)
    assert pytest.raises is original
    out = parse_pytest_output(capsys.readouterr().out)
    assert out.caught_by_raises == ["ValueError: bad input"]


def test_excerpt_skips_fixture_arguments_and_cuts_long_lines():
    assertion = ["AssertionError: m on cpu: 63 wrong positions " + "x" * 300, "(note: 2 other explicit examples also failed)"]
    falsifying = ["Failing explicit example: test_prepared_positions_match_reference(",
                  "    positions_impl_name='m',", "    device='cpu',", "    batch=RaggedBatch(num_dims=3,", ")"]
    first, second = mutation.excerpt(assertion, falsifying).splitlines()
    assert first.startswith("m on cpu: 63 wrong positions x") and first.endswith("...") and len(first) == 160
    assert second == "batch=RaggedBatch(num_dims=3,"


def test_parse_all_passed():
    text = ("properties/test_x.py::test_a[m-cpu] PASSED [ 50%]\nproperties/test_x.py::test_b SKIPPED (why) [100%]\n"
            "=================== 1 passed, 1 skipped, 2 warnings in 3.50s (0:00:03) ===================\n")
    out = parse_pytest_output(text)
    assert out.failed == [] and len(out.ran) == 2 and out.pytest_s == 3.5
    assert out.counts == {"passed": 1, "skipped": 1, "warnings": 2}


# --------------------------------------------------------------------------- the mutants and their suites
def _defined_mutants() -> set[tuple[str, str]]:
    """(module, name) of every entry of every mutant registry in properties/mutants: the module-level
    dicts named BROKEN_* or *_MUTANTS, found by scanning, so a new registry cannot be missed."""
    import properties.mutants as package
    found = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"properties.mutants.{info.name}")
        for attr, value in vars(module).items():
            if isinstance(value, dict) and attr.isupper() and (attr.startswith("BROKEN") or attr.endswith("MUTANTS")):
                found |= {(info.name, name) for name in value}
    return found


def test_mutant_list_covers_every_mutant_defined():
    mutants = mutation.discover_mutants()
    names = [m.name for m in mutants]
    assert len(names) == len(set(names))
    assert {tuple(n.split(":")) for n in names} == _defined_mutants()
    assert {m.kind for m in mutants} == set(mutation.KINDS)


def test_every_mutant_and_parent_resolves():
    from properties.mutants.dispatch import BROKEN_OPS
    from rope.registry import get_implementation, get_positions_implementation
    for m in mutation.discover_mutants():
        if m.kind in mutation.ROTATION_KINDS:
            assert callable(get_implementation(m.target)) and callable(get_implementation(m.parent))
        elif m.kind.startswith("positions"):
            assert callable(get_positions_implementation(m.target)) and callable(get_positions_implementation(m.parent))
        else:
            module, _, attr = m.target.partition(":")
            assert m.parent is None and getattr(importlib.import_module(module), attr) is BROKEN_OPS[m.attribute][1]


def test_memory_safety_split_matches_test_mutants():
    from properties.mutants.kernel import POSITIONS_MUTANTS
    from properties.test_mutants import ROTARY_CELLS
    guards_only = {name for name, (_, _, must, _) in ROTARY_CELLS.items() if "plain" not in must}
    assert mutation.MEMORY_SAFETY == guards_only | set(POSITIONS_MUTANTS)


def _parametrized_ids(path: str, function: str) -> set[str]:
    from properties.mutants.dispatch import BROKEN_OPS
    from properties.mutants.kernel import POSITIONS_MUTANTS
    from properties.test_mutants import ROTARY_CELLS
    return {("test_dispatch.py", "test_dispatch_property_rejects_broken_op"): set(BROKEN_OPS),
            ("test_mutants.py", "test_rotation_property_catches_kernel_mutant"): set(ROTARY_CELLS),
            ("test_mutants.py", "test_position_property_catches_kernel_mutant"): set(POSITIONS_MUTANTS),
            }[path.rsplit("/", 1)[-1], function]


def test_stages_name_tests_that_exist():
    for m in mutation.discover_mutants():
        stages = mutation.harness_stages(m) + mutation.baseline_stages(m)
        assert stages and stages[0].caught_when in ("fail", "pass")
        for stage in stages:
            for test in stage.tests:
                path, _, rest = test.partition("::")
                assert (mutation.suite_root() / path).exists(), test
                if not rest:
                    continue
                function, _, param = rest.partition("[")
                assert function in mutation.functions_in(path), test
                if param:
                    assert param.rstrip("]") in _parametrized_ids(path, function), test
            if stage.caught_when == "fail":
                assert stage.impl_option and stage.options[stage.options.index(stage.impl_option) + 1] == m.target
        assert bool(mutation.baseline_stages(m)) == (m.kind in mutation.ROTATION_KINDS)


def test_memory_safety_rotation_mutants_run_the_guarded_tests_first():
    every = mutation.functions_in(mutation.ROTATION_SUITE)
    for m in mutation.discover_mutants():
        if m.kind != "rotation-kernel":
            continue
        first = mutation.harness_stages(m)[0]
        if m.memory_safety:
            assert first.tests[0] == f"{mutation.ROTATION_SUITE}::test_known_bug_triggers_under_guards"
            assert sorted(t.split("::")[1] for t in first.tests) == sorted(every)
        else:
            assert first.tests == (mutation.ROTATION_SUITE,)


def test_only_selects_by_full_or_bare_name_and_rejects_unknown():
    mutants = mutation.discover_mutants()
    both = mutation.select_mutants(mutants, ["neox_for_gptj"])
    assert [m.name for m in both] == ["broken_rotations:neox_for_gptj", "kernel:neox_for_gptj"]
    assert [m.name for m in mutation.select_mutants(mutants, ["kernel:neox_for_gptj"])] == ["kernel:neox_for_gptj"]
    with pytest.raises(ValueError, match=r"--only='no_such_bug': no such mutant"):
        mutation.select_mutants(mutants, ["no_such_bug"])


# --------------------------------------------------------------------------- the runner, on a fake pytest
TARGET = "properties.mutants.kernel:neox_for_gptj"
MUTANT = Mutant("kernel:neox_for_gptj", "rotation-kernel", TARGET, "triton")
NODES = [f"properties/baseline/test_engine_style.py::test_mrope_engine_style[{{}}-cpu-{c}]" for c in
         ("glm-1-11", "glm-1-8192", "glm-2-11")]


def _pytest_output(results: list[tuple[str, str]], seconds: float, message: str = "AssertionError: boom") -> str:
    lines = [f"{node} {result} [ 50%]" for node, result in results]
    failed = [node for node, result in results if result == "FAILED"]
    if failed:
        lines += ["=" * 10 + " FAILURES " + "=" * 10, f"_ {failed[0].split('::')[1]} _",
                  *(f"E   {line}" for line in message.splitlines()),
                  "=" * 5 + " short test summary info " + "=" * 5, f"FAILED {failed[0]}"]
    counts = ", ".join(f"{sum(r == w for _, r in results)} {w.lower()}" for w in ("FAILED", "PASSED")
                       if any(r == w for _, r in results))
    return "\n".join(lines + [f"===== {counts} in {seconds}s ====="]) + "\n"


class FakePytest:
    """Answers the runner's pytest calls from a table: impl -> {node: PASSED|FAILED}."""

    def __init__(self, outcomes: dict, seconds: float = 2.0, timeout_after: str | None = None):
        self.outcomes, self.seconds, self.timeout_after, self.calls = outcomes, seconds, timeout_after, []

    def __call__(self, args, timeout_s, env):
        self.calls.append(args)
        assert env["ROPE_CASES_DIR"] == "off" and env["ROPE_NO_REPORT"] == "1"
        impl = args[args.index("--rope-impl") + 1]
        tests = [a for a in args if a.startswith("properties/")]
        nodes = [n.format(impl) for n in NODES]
        if "--collect-only" in args:
            return RawRun(0, "\n".join(nodes) + "\n\n3 tests collected in 0.1s\n", 0.5)
        if tests != ["properties/baseline"]:
            nodes = tests
        results = []
        for node in nodes:
            results.append((node, self.outcomes[impl][node.split("-cpu-")[1].rstrip("]")]))
            if node.endswith(f"{self.timeout_after}]"):
                return RawRun(-9, _pytest_output(results, self.seconds)[:-40], timeout_s, timed_out=True)
            if results[-1][1] == "FAILED":
                return RawRun(1, _pytest_output(results, self.seconds), self.seconds + 1)
        return RawRun(0, _pytest_output(results, self.seconds), self.seconds + 1)


def test_failure_the_parent_shares_is_a_false_alarm_and_the_suite_goes_on():
    fake = FakePytest({TARGET: {"glm-1-11": "PASSED", "glm-1-8192": "FAILED", "glm-2-11": "FAILED"},
                       "triton": {"glm-1-8192": "FAILED", "glm-2-11": "PASSED"}})
    result = MutationRunner(execute=fake).run_suite(MUTANT, "baseline")
    assert result.status == "caught" and result.test == NODES[2].format(TARGET)
    assert result.false_alarms == [NODES[1].format(TARGET)]
    assert [c.parent_failed for c in result.controls] == [True, False]
    assert result.controls[0].parent_test == NODES[1].format("triton")
    # The mutant's own runs only: 2 runs of 2.0 s pytest time (the controls and collection do not count).
    assert [r.outcome for r in result.runs] == ["false-alarm", "caught"]
    assert result.pytest_s == 4.0 and result.suite_s == 4.0 and result.wall_s == 6.0
    assert result.runs[1].command.split()[1] == NODES[2].format(TARGET)     # resumed after the false alarm
    assert result.assertion == ["AssertionError: boom"]


def test_without_control_the_first_failure_counts():
    fake = FakePytest({TARGET: {"glm-1-11": "PASSED", "glm-1-8192": "FAILED"}})
    result = MutationRunner(execute=fake, confirm=False).run_suite(MUTANT, "baseline")
    assert result.caught and result.test == NODES[1].format(TARGET) and result.controls == []


def test_suite_that_only_fails_where_the_parent_fails_lets_the_mutant_survive():
    fake = FakePytest({TARGET: {"glm-1-11": "PASSED", "glm-1-8192": "FAILED", "glm-2-11": "PASSED"},
                       "triton": {"glm-1-8192": "FAILED"}})
    result = MutationRunner(execute=fake).run_suite(MUTANT, "baseline")
    assert result.status == "survived" and not result.caught and result.false_alarms == [NODES[1].format(TARGET)]


def test_failure_not_naming_the_mutant_is_no_catch():
    fake = FakePytest({TARGET: {"glm-1-11": "PASSED", "glm-1-8192": "PASSED", "glm-2-11": "PASSED"}})
    runner = MutationRunner(execute=fake)
    other = "properties/test_rotation.py::test_reference_text_tokens_reduce_to_1d"
    stage = Stage("rotation suite", ("properties/baseline",), ("--rope-impl", TARGET), "fail", "--rope-impl")
    result = mutation.SuiteResult("harness")
    outcome, node = runner._judge(MUTANT, stage, RawRun(1, _pytest_output([(other, "FAILED")], 1.0), 2.0),
                                  parse_pytest_output(_pytest_output([(other, "FAILED")], 1.0)), result)
    assert (outcome, node) == ("unrelated-failure", other) and not fake.calls


def test_timeout_is_not_a_catch():
    fake = FakePytest({TARGET: {"glm-1-11": "PASSED", "glm-1-8192": "PASSED"}}, timeout_after="glm-1-8192")
    result = MutationRunner(execute=fake, budget_s=30).run_suite(MUTANT, "baseline")
    assert result.status == "timeout" and not result.caught and result.wall_s == 30


def test_catch_over_the_limit_is_flagged_slow():
    fake = FakePytest({TARGET: {"glm-1-11": "FAILED"}, "triton": {"glm-1-11": "PASSED"}}, seconds=61.0)
    result = MutationRunner(execute=fake).run_suite(MUTANT, "baseline")
    assert result.caught and result.slow and result.suite_s == 61.0
    assert any("over the 60 s limit" in note for note in result.notes)


def test_position_kernel_mutants_run_guarded_first_and_a_crash_is_no_catch():
    # Unguarded, a position kernel writing past its output corrupts the test process (a crash,
    # or a hang until the budget is spent): the guarded dedicated test runs first.
    m = Mutant("kernel:positions_store_unmasked", "positions-kernel", STORE_UNMASKED, "triton", memory_safety=True)
    calls = []

    def fake(args, timeout_s, env):
        calls.append(args)
        if "--rope-positions-impl" in args:
            return RawRun(-11, CRASH, 3.0)
        assert "-p" in args and "rope.harness.mutation" in args       # the echo plugin is loaded for dedicated tests
        return RawRun(0, DEDICATED_PASS, 4.0)
    result = MutationRunner(execute=fake).run_suite(m, "harness")
    assert [r.outcome for r in result.runs] == ["caught"] and len(calls) == 1
    assert result.caught and result.stage.startswith("guarded search")
    assert result.suite_s == 1.98

    def dedicated_fails(args, timeout_s, env):
        if "--rope-positions-impl" in args:
            return RawRun(-11, CRASH, 3.0)
        return RawRun(1, _pytest_output([(args[0], "FAILED")], 1.0, "Failed: DID NOT RAISE"), 2.0)
    crashed = MutationRunner(execute=dedicated_fails).run_suite(m, "harness")
    assert [r.outcome for r in crashed.runs][-1] == "crashed" and not crashed.caught
    assert any("Segmentation fault" in note for note in crashed.notes)

    def failing(args, timeout_s, env):
        if "--rope-positions-impl" in args:
            return RawRun(0, "properties/test_x.py::test_a[m-cpu] PASSED [100%]\n=== 1 passed in 1.0s ===\n", 2.0)
        return RawRun(1, _pytest_output([(args[0], "FAILED")], 1.0, "Failed: DID NOT RAISE"), 2.0)
    survived = MutationRunner(execute=failing).run_suite(m, "harness")
    assert survived.status == "survived" and not survived.caught


# --------------------------------------------------------------------------- reports and exit status
def test_reports_are_written_atomically_and_well_formed(tmp_path):
    fake = FakePytest({TARGET: {"glm-1-11": "PASSED", "glm-1-8192": "FAILED", "glm-2-11": "FAILED"},
                       "triton": {"glm-1-8192": "FAILED", "glm-2-11": "PASSED"}})
    caught = mutation.MutantResult(MUTANT, MutationRunner(execute=fake).run_suite(MUTANT, "baseline"))
    caught.harness.suite = "harness"
    alive = mutation.MutantResult(Mutant("dispatch:x", "dispatch", "properties.mutants.dispatch:X", None, "doc | pipe"),
                                  mutation.SuiteResult("harness", status="survived", notes=["nothing failed"]))
    report = mutation.MutationReport([caught, alive], "ci", 60.0, 300.0, 2, True, True, 12.5, "2025-01-01T00:00:00")
    paths = mutation.write_reports(report, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mutants.json", "mutants.md"] == sorted(p.name for p in paths)
    data = json.loads(paths[0].read_text())
    assert data["schema"] == mutation.SCHEMA and data["total_wall_s"] == 12.5
    assert [m["name"] for m in data["mutants"]] == ["kernel:neox_for_gptj", "dispatch:x"]
    first = data["mutants"][0]
    assert first["harness"]["caught"] is True and first["harness"]["false_alarms"] == [NODES[1].format(TARGET)]
    assert first["harness"]["runs"][0]["outcome"] == "false-alarm" and first["baseline"] is None
    assert data["mutants"][1]["dedicated"] is True and data["mutants"][1]["harness"]["caught"] is False
    assert data["summary"]["harness"]["caught"] == 1 and data["summary"]["survivors"] == ["dispatch:x"]
    md = paths[1].read_text()
    assert "| mutant | kind | harness caught? |" in md
    assert "| `kernel:neox_for_gptj` | rotation-kernel | yes 1 false alarm skipped | 6.0 / 4.0 | n/a | - |" in md
    assert "| `dispatch:x` | dispatch (dedicated test) | NO (survived) |" in md
    assert "doc \\| pipe" not in md.split("## Details")[0] and "dedicated tests in properties/test_dispatch.py" in md
    assert mutation.exit_code(report) == 1
    report.results.pop()
    assert mutation.exit_code(report) == 0


def test_cli_rejects_an_unknown_mutant(tmp_path, capsys):
    assert mutation.main(["--only", "no_such_bug", "--out", str(tmp_path)]) == 2
    assert "no such mutant" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- end to end
def test_end_to_end_key_unrotated_is_caught(tmp_path):
    # One real pytest subprocess on the mutant and one on its parent (the control): ~10 s.
    assert mutation.main(["--only", "broken_rotations:key_unrotated", "--no-baseline", "--jobs", "1",
                          "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "mutants.json").read_text())
    (entry,) = data["mutants"]
    harness = entry["harness"]
    assert entry["name"] == "broken_rotations:key_unrotated" and entry["baseline"] is None
    assert harness["caught"] and harness["stage"] == "rotation suite" and not harness["slow"]
    assert harness["test"].startswith("properties/test_rotation.py::") and KEY_UNROTATED in harness["test"]
    assert "does not match the reference" in harness["assertion"][0] and "key_only" in harness["assertion"][1]
    # The known-bug triggers run first (conftest): a fixed case, so no Hypothesis example to shrink.
    assert "test_known_bug_triggers" in harness["test"] and harness["falsifying_example"] == []
    assert harness["controls"][0]["parent_failed"] is False and "[native-cpu-" in harness["controls"][0]["parent_test"]
    assert 0 < harness["pytest_s"] <= harness["wall_s"]
    assert "| `broken_rotations:key_unrotated` | rotation | yes |" in (tmp_path / "mutants.md").read_text()
