"""The mutation runner's own logic (rope/harness/mutation/): the catalogue read from the suite, the
stages each mutant runs, the records plugin that writes what a pytest run did, the judging from
those records (the parent control, false alarms, timeouts, crashes), the reports; and one real run
on one fast mutant."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rope.harness import mutation
from rope.harness.mutation import catalogue, records, report, stages
from rope.harness.mutation.catalogue import CatalogueError, Mutant
from rope.harness.mutation.outcome import PytestRun, excerpt, split_failure
from rope.harness.mutation.records import RECORDS_ENV, read_records
from rope.harness.mutation.results import MutantResult, MutationReport, SuiteResult, exit_code
from rope.harness.mutation.runner import MutationRunner, RawRun
from rope.harness.mutation.stages import Stage
from rope.harness.suite import subprocess_env

# The harness's own machinery, checked on the CPU (subprocess runs pinned to --rope-device cpu): a GPU
# run leaves it to CPU CI unless --rope-cpu-work asks (rope.harness.plugin.selection).
pytestmark = pytest.mark.needs_no_gpu

KEY_UNROTATED = "properties.mutants.broken_rotations:key_unrotated"
DELTA_PER_CHUNK = "properties.mutants.broken_positions:delta_per_chunk"
STORE_UNMASKED = "properties.mutants.kernel:positions_store_unmasked"

# Exceptions as the records plugin describes them (type, str(), __notes__), from real runs.
ROTATION_EXCEPTION = {
    "type": "AssertionError",
    "message": f"{KEY_UNROTATED} on cpu does not match the reference (case 2e5a0c12626956cb)\n"
               "diagnosis: key_only: only the key is wrong, it comes back exactly as it went in (never rotated)\n"
               "Mismatched elements: 64 / 128 (50.0%)\n"
               "case: RotationCase(spec=RopeSpec(head_size=64, rotary_dim=64, is_neox_style=True), num_tokens=1, seed=0)\n"
               "case file: not written (ROPE_CASES_DIR='off')",
    "notes": [f"Failing test case: test_rotation_matches_reference(\n    impl_name='{KEY_UNROTATED}',\n"
              "    data=data(...),\n)",
              "Draw 1 (case): RotationCase(spec=RopeSpec(head_size=64,\n seed=0)",
              "Explanation:\n    These lines were always and only run by failing test cases:\n        /work/main/rope/spec.py:243",
              "\nYou can reproduce this test case by temporarily adding @reproduce_failure('6.170.17', b'AXic') as a "
              "decorator on your test function"],
}
STATEFUL_EXCEPTION = {
    "type": "AssertionError",
    "message": "step 2: prepared positions [[3], [3], [3]] != whole-sequence positions [[2], [2], [2]]\n"
               "assert False\n +  where False = <built-in method equal>(tensor([[3]]), tensor([[2]]))",
    "notes": ["Failing test case: <state machine>", "state = Scheduler()",
              "state.add_request(data=data(...), max_new=1, prompt=Prompt(tuple([Text(length=2)])), seed=0)",
              "state.step(budget=1, data=data(...))", "state.teardown()"],
}
DISPATCH_CAUGHT = {
    "type": "AssertionError",
    "message": "MRopeCachedCosSin platform=xpu mode=eager on cpu: forward_xpu does not match the reference\n"
               "case: RotationCase(spec=RopeSpec(head_size=64, rotary_dim=64), num_tokens=1, seed=0)",
    "notes": ["Failing test case: dispatch_matches_reference(\n    combo=('mrope-chunked', 'xpu', 'eager'),\n"
              "    data=data(...),\n)", "Draw 1 (case): RotationCase(spec=RopeSpec(head_size=64,\n seed=0)"],
}
DID_NOT_RAISE = {"type": "Failed", "message": "DID NOT RAISE <class 'AssertionError'>", "notes": []}


# --------------------------------------------------------------------------- failure text
def test_split_failure_gives_assertion_and_example_without_explanation():
    assertion, falsifying = split_failure(ROTATION_EXCEPTION)
    assert assertion[0] == (f"AssertionError: {KEY_UNROTATED} on cpu does not match the reference "
                            "(case 2e5a0c12626956cb)")
    assert assertion[-1] == "case file: not written (ROPE_CASES_DIR='off')"
    assert falsifying[0] == "Failing test case: test_rotation_matches_reference("
    assert falsifying[-1] == " seed=0)"            # up to Hypothesis' explanation, which is left out
    assert not any("Explanation" in line or "reproduce" in line for line in falsifying)
    assert excerpt(assertion, falsifying).splitlines() == [
        f"{KEY_UNROTATED} on cpu does not match the reference (case 2e5a0c12626956cb)",
        "case: RotationCase(spec=RopeSpec(head_size=64, rotary_dim=64, is_neox_style=True), num_tokens=1, seed=0)"]


def test_split_stateful_failure_keeps_the_steps_and_drops_assert_rewriting():
    assertion, falsifying = split_failure(STATEFUL_EXCEPTION)
    assert assertion == ["AssertionError: step 2: prepared positions [[3], [3], [3]] != whole-sequence "
                         "positions [[2], [2], [2]]"]
    assert falsifying[:2] == ["Failing test case: <state machine>", "state = Scheduler()"]
    assert falsifying[-1] == "state.teardown()"
    assert excerpt(assertion, falsifying).splitlines()[1] == "state.step(budget=1, data=data(...))"


def test_split_keeps_notes_before_the_example_and_bare_asserts():
    exc = {"type": "AssertionError", "message": "assert 100 < 5",
           "notes": ["(note: 1 other explicit example also failed with this error)",
                     "Failing explicit example: test_b(\n    x=100,\n)"]}
    assert split_failure(exc) == (["(note: 1 other explicit example also failed with this error)"],
                                  ["Failing explicit example: test_b(", "    x=100,", ")"])
    assert split_failure(DID_NOT_RAISE) == (["Failed: DID NOT RAISE <class 'AssertionError'>"], [])


def test_excerpt_skips_fixture_arguments_and_cuts_long_lines():
    assertion = ["AssertionError: m on cpu: 63 wrong positions " + "x" * 300, "(note: 2 other explicit examples also failed)"]
    falsifying = ["Failing explicit example: test_prepared_positions_match_reference(",
                  "    positions_impl_name='m',", "    device='cpu',", "    batch=RaggedBatch(num_dims=3,", ")"]
    first, second = excerpt(assertion, falsifying).splitlines()
    assert first.startswith("m on cpu: 63 wrong positions x") and first.endswith("...") and len(first) == 160
    assert second == "batch=RaggedBatch(num_dims=3,"


# --------------------------------------------------------------------------- records (fake runs)
def _report(node, when, outcome_, **extra):
    return {"event": "report", "nodeid": node, "when": when, "outcome": outcome_, "duration": 0.1,
            "wasxfail": False, **extra}


def fake_records(results, seconds, *, collected=None, exception=ROTATION_EXCEPTION, caught=(),
                 finished=True) -> list[dict]:
    """Records of a run: ``results`` is [(node, passed|failed|skipped|crash)]; ``crash`` leaves the
    test started without a report, and the session without its end."""
    out = [{"event": "session", "pid": 1}]
    if collected is not None:
        out.append({"event": "collected", "nodeids": list(collected)})
    status = 0
    for node, result in results:
        out += [{"event": "start", "nodeid": node}, _report(node, "setup", "passed")]
        if result == "crash":
            return out
        extra = {"caught": list(caught)}
        if result == "failed":
            status = 1
            extra.update(longrepr="E   boom", crash=exception["message"], exception=exception)
        out += [_report(node, "call", result, **extra), _report(node, "teardown", "passed")]
    if finished:
        out.append({"event": "finish", "exitstatus": status, "duration": seconds})
    return out


def write_records(env, lines) -> None:
    with open(env[RECORDS_ENV], "a") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)


def test_run_summary_from_records_and_a_line_cut_short(tmp_path):
    nodes = ["t.py::a", "t.py::b", "t.py::c"]
    lines = fake_records([(nodes[0], "passed"), (nodes[1], "skipped"), (nodes[2], "failed")], 3.5, collected=nodes)
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"event": "report", "nodeid": "t.p')
    got = read_records(path)
    assert got == lines                                     # the torn last line is skipped
    run = PytestRun.from_records(got)
    assert run.finished and run.pytest_s == 3.5 and run.collected == nodes and run.ran == nodes
    assert run.failed == [nodes[2]] and run.passed == [nodes[0]] and run.running is None
    assert run.summary == "1 failed, 1 passed, 1 skipped"
    assert run.failure_text(nodes[2])[0][0].startswith("AssertionError: properties.mutants.broken_rotations")
    crashed = PytestRun.from_records(fake_records([(nodes[0], "passed"), (nodes[1], "crash")], 1.0))
    assert not crashed.finished and crashed.running == nodes[1] and crashed.pytest_s is None
    assert crashed.ran == [nodes[0]] and crashed.summary == "1 passed"
    assert read_records(tmp_path / "missing.jsonl") == []


# --------------------------------------------------------------------------- the records plugin, for real
PLUGIN_TESTS = """
import os, signal
import pytest
from pytest import raises
from hypothesis import given, settings, strategies as st

SEARCH = settings(derandomize=True, database=None, print_blob=True)

def test_passes():
    pass

@SEARCH
@given(x=st.integers())
def test_property_fails(x):
    assert x < 5, f"x too big: {x}\\ncase: {x}"

def test_dedicated_catches():
    @SEARCH
    @given(x=st.integers())
    def prop(x):
        assert x < 3, "prop rejects"
    with pytest.raises(AssertionError, match="prop rejects"):
        prop()
    with raises(KeyError):                 # the module's own binding of pytest.raises
        {}["missing"]

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass

def test_dies():
    if os.environ.get("DIE"):
        os.kill(os.getpid(), signal.SIGSEGV)
"""


def _pytest_in(tmp_path, *args, env_extra=None):
    test_file = tmp_path / "test_plugin_target.py"
    test_file.write_text(PLUGIN_TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "ROPE_"))}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "pytest", str(test_file), "-p", records.PLUGIN, "-p",
                           "no:cacheprovider", "-q", *args], cwd=tmp_path, env=subprocess_env(env), capture_output=True, text=True,
                          timeout=120)


def test_records_plugin_writes_one_line_per_report_with_the_failure_and_what_raises_caught(tmp_path):
    path = tmp_path / "records.jsonl"
    proc = _pytest_in(tmp_path, env_extra={RECORDS_ENV: str(path)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = read_records(path)
    assert len(lines) == len(path.read_text().splitlines())          # every line is one JSON record
    assert lines[0]["event"] == "session" and lines[0]["pid"] != os.getpid()
    node = {name: f"test_plugin_target.py::{name}" for name in
            ("test_passes", "test_property_fails", "test_dedicated_catches", "test_skipped", "test_dies")}
    assert lines[1] == {"event": "collected", "nodeids": list(node.values())}
    assert [(r["nodeid"], r["when"], r["outcome"]) for r in lines if r["event"] == "report"] == [
        (node[n], w, "skipped" if (n, w) == ("test_skipped", "setup") else
         "failed" if (n, w) == ("test_property_fails", "call") else "passed")
        for n in node for w in (("setup", "teardown") if n == "test_skipped" else ("setup", "call", "teardown"))]
    starts = [i for i, r in enumerate(lines) if r["event"] == "start"]
    assert [lines[i]["nodeid"] for i in starts] == list(node.values())
    assert all(lines[i + 1]["when"] == "setup" for i in starts)      # announced before it runs
    failed = next(r for r in lines if r["event"] == "report" and r["outcome"] == "failed")
    assert failed["exception"]["type"] == "AssertionError"
    assert failed["exception"]["message"].startswith("x too big: 5\n")
    assert failed["exception"]["notes"][0] == "Failing test case: test_property_fails(\n    x=5,\n)"
    assert "x too big" in failed["longrepr"] and failed["crash"].startswith("AssertionError: x too big: 5")
    assert failed["duration"] > 0
    dedicated = next(r for r in lines if r.get("nodeid") == node["test_dedicated_catches"] and r.get("when") == "call")
    assert [(c["type"], c["message"].splitlines()[0]) for c in dedicated["caught"]] == [
        ("AssertionError", "prop rejects"), ("KeyError", "'missing'")]
    assert dedicated["caught"][0]["notes"][0].startswith("Failing test case: prop(")
    skipped = next(r for r in lines if r.get("outcome") == "skipped")
    assert skipped["longrepr"] == "Skipped: not here"
    assert lines[-1]["event"] == "finish" and lines[-1]["exitstatus"] == 1 and lines[-1]["duration"] > 0
    run = PytestRun.from_records(lines)
    assert run.failed == [node["test_property_fails"]] and run.summary == "1 failed, 3 passed, 1 skipped"
    assert run.failure_text(node["test_property_fails"]) == (["AssertionError: x too big: 5", "  case: 5"],
                                                           ["Failing test case: test_property_fails(", "    x=5,", ")"])
    assert run.caught_text(node["test_dedicated_catches"]) == (["AssertionError: prop rejects"],
                                                              ["Failing test case: prop(", "    x=3,", ")"])


def test_records_plugin_is_inert_without_a_file_and_takes_the_option(tmp_path):
    proc = _pytest_in(tmp_path, "-k", "test_passes")
    assert proc.returncode == 0 and not list(tmp_path.glob("*.jsonl")), proc.stdout + proc.stderr
    path = tmp_path / "by-option.jsonl"
    proc = _pytest_in(tmp_path, "-k", "test_passes", records.OPTION, str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["event"] for r in read_records(path)] == ["session", "collected", "start", "report", "report", "report",
                                                        "finish"]


def test_a_crashed_pytest_is_judged_from_the_records_it_wrote(tmp_path):
    path = tmp_path / "records.jsonl"
    proc = _pytest_in(tmp_path, "-k", "test_passes or test_dies", env_extra={RECORDS_ENV: str(path), "DIE": "1"})
    assert proc.returncode == -signal.SIGSEGV
    run = PytestRun.from_records(read_records(path))
    assert run.started and not run.finished and run.passed == ["test_plugin_target.py::test_passes"]
    assert run.running == "test_plugin_target.py::test_dies"


# --------------------------------------------------------------------------- the catalogue
def _defined_mutants() -> set[tuple[str, str]]:
    """(module, name) of every entry of every mutant registry in properties/mutants: the module-level
    dicts named BROKEN_* or *_MUTANTS, found by scanning, so a new registry cannot be missed."""
    import ast
    import properties.mutants as package
    found = set()
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"properties.mutants.{info.name}")
        # The registries a module defines (an assignment of its own), not those it imports.
        defined = {target.id for node in ast.parse(Path(module.__file__).read_text()).body
                   if isinstance(node, ast.Assign) for target in node.targets if isinstance(target, ast.Name)}
        for attr, value in vars(module).items():
            if (attr in defined and isinstance(value, dict) and attr.isupper()
                    and (attr.startswith("BROKEN") or attr.endswith("MUTANTS"))):
                found |= {(info.name, name) for name in value}
    return found


def test_catalogue_covers_every_mutant_defined():
    mutants = mutation.discover_mutants()
    names = [m.name for m in mutants]
    assert len(names) == len(set(names))
    assert {tuple(n.split(":")) for n in names} == _defined_mutants()
    assert {m.kind for m in mutants} == set(catalogue.KINDS)


def test_catalogue_is_read_without_importing_the_suite():
    # rope/ never imports properties: the catalogue comes from `python -m properties.mutants`.
    code = ("import sys; from rope.harness.mutation import discover_mutants, harness_stages, cli, runner, report; "
            "ms = discover_mutants(); [harness_stages(m) for m in ms]; "
            "print(len(ms), sorted(k for k in sys.modules if k.split('.')[0] == 'properties'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(len(mutation.discover_mutants())), "[]"]


def test_catalogue_output_is_the_suites_own_list():
    from properties.mutants.catalogue import SCHEMA, catalogue as suite_catalogue
    assert SCHEMA == catalogue.CATALOGUE_SCHEMA
    assert [Mutant.from_dict(d) for d in suite_catalogue()] == mutation.discover_mutants()


def test_catalogue_rejects_what_is_not_a_catalogue():
    good = {"name": "m:x", "kind": "rotation", "target": "p.m:x", "parent": "native", "doc": "", "memory_safety": False}
    ok = catalogue.parse_catalogue(json.dumps({"schema": catalogue.CATALOGUE_SCHEMA, "mutants": [good]}))
    assert ok == [Mutant("m:x", "rotation", "p.m:x", "native")]
    for text, match in (("not json", "not JSON"), (json.dumps({"schema": "other", "mutants": []}), "schema"),
                        (json.dumps({"schema": catalogue.CATALOGUE_SCHEMA, "mutants": [{**good, "kind": "x"}]}),
                         "kind='x'"),
                        (json.dumps({"schema": catalogue.CATALOGUE_SCHEMA, "mutants": [good, good]}), "duplicate"),
                        (json.dumps({"schema": catalogue.CATALOGUE_SCHEMA, "mutants": [{"kind": "dispatch"}]}),
                         "without")):
        with pytest.raises(CatalogueError, match=match):
            catalogue.parse_catalogue(text)


def test_every_mutant_and_parent_resolves():
    from properties.mutants.dispatch import BROKEN_OPS
    from rope.registry import get_implementation, get_positions_implementation
    for m in mutation.discover_mutants():
        if m.kind in catalogue.ROTATION_KINDS:
            assert callable(get_implementation(m.target)) and callable(get_implementation(m.parent))
        elif m.kind.startswith("positions"):
            assert callable(get_positions_implementation(m.target)) and callable(get_positions_implementation(m.parent))
        elif m.kind == "position-ids":
            from rope.harness.position_ids.implementations import get_position_ids_implementation
            assert callable(get_position_ids_implementation(m.target))
            assert callable(get_position_ids_implementation(m.parent))
        elif m.kind == "table":
            from rope.registry import get_table_implementation
            assert callable(get_table_implementation(m.target)) and callable(get_table_implementation(m.parent))
        elif m.kind == "fused":
            from rope.registry import get_fused_implementation
            assert get_fused_implementation(m.target) and get_fused_implementation(m.parent)
        else:
            module, _, attr = m.target.partition(":")
            assert m.parent is None and getattr(importlib.import_module(module), attr) is BROKEN_OPS[m.attribute][1]


def test_memory_safety_split_matches_the_rotary_cells():
    from properties.mutants.kernel import POSITIONS_MUTANTS, ROTARY_CELLS
    guards_only = {name for name, (_, _, must, _) in ROTARY_CELLS.items() if "plain" not in must}
    assert {m.attribute for m in mutation.discover_mutants() if m.memory_safety} == guards_only | set(POSITIONS_MUTANTS)


def test_only_selects_by_full_or_bare_name_and_rejects_unknown():
    mutants = mutation.discover_mutants()
    both = mutation.select_mutants(mutants, ["neox_for_gptj"])
    assert [m.name for m in both] == ["broken_rotations:neox_for_gptj", "kernel:neox_for_gptj"]
    assert [m.name for m in mutation.select_mutants(mutants, ["kernel:neox_for_gptj"])] == ["kernel:neox_for_gptj"]
    assert [m.name for m in mutation.select_mutants(mutants, [KEY_UNROTATED])] == ["broken_rotations:key_unrotated"]
    with pytest.raises(ValueError, match=r"--only='no_such_bug': no such mutant"):
        mutation.select_mutants(mutants, ["no_such_bug"])


# --------------------------------------------------------------------------- the stages
def _searched(m) -> set[str]:
    """The mutants a dedicated search exists for, by catalogue name (each test param marked mutant_search)."""
    from properties.mutants.dispatch import BROKEN_OPS
    from properties.mutants.kernel import POSITIONS_MUTANTS, ROTARY_CELLS
    return {*(f"kernel:{n}" for n in (*ROTARY_CELLS, *POSITIONS_MUTANTS)), *(f"dispatch:{n}" for n in BROKEN_OPS)}


def test_stages_select_by_sub_package_and_marker():
    # A stage names the sub-package of its checked thing and selects by marker (or asks for a
    # mutant's dedicated search by name), never by a list of files or tests.
    from rope.harness.plugin import MARKERS
    registered = {line.split(":")[0].split("(")[0] for line in MARKERS}
    for m in mutation.discover_mutants():
        all_stages = stages.harness_stages(m) + stages.baseline_stages(m)
        assert all_stages and all_stages[0].caught_when in ("fail", "pass")
        for stage in all_stages:
            for test in stage.tests:
                assert "::" not in test and not test.endswith(".py"), test
                assert (stages.suite_root() / test / "__init__.py").exists(), test
            options = list(stage.options)
            if "-m" in options:
                expression = options[options.index("-m") + 1]
                assert set(expression.replace("not ", "").split()) <= registered, expression
            if stage.caught_when == "fail":
                assert stage.impl_option and stage.options[stage.options.index(stage.impl_option) + 1] == m.target
            else:
                assert options[options.index(stages.SEARCH_OPTION) + 1] == m.name and m.name in _searched(m)
        assert bool(stages.baseline_stages(m)) == (m.kind in catalogue.ROTATION_KINDS)


def test_memory_safety_mutants_run_the_guarded_tests_first():
    for m in mutation.discover_mutants():
        first = stages.harness_stages(m)[0]
        if m.kind == "rotation-kernel" and m.memory_safety:
            assert first.tests == (stages.ROTATION_SUITE,) and first.options[-2:] == ("-m", stages.GUARDED)
            assert stages.harness_stages(m)[-1].caught_when == "pass"
        elif m.kind == "positions-kernel":
            assert first.caught_when == "pass" and first.tests == stages.POSITION_SUITES
        elif m.needs == "gpu-deep":
            assert first.tests == (stages.ROTATION_SUITE,) and ("-m", stages.HUGE) == first.options[2:4]
            assert first.profile == "deep" and "--hypothesis-profile=deep" in stages.build_pytest_args(first, first.tests, "ci")
        elif m.kind in catalogue.ROTATION_KINDS:
            assert first.tests == (stages.ROTATION_SUITE,)


def test_stages_and_arguments_come_from_the_installed_suite(tmp_path, monkeypatch):
    # A wheel's suite in site-packages: the tests are found (and pytest runs) there, not in a checkout.
    site = tmp_path / "site-packages"
    (site / "properties" / "rotation").mkdir(parents=True)
    monkeypatch.setattr(stages, "suite_dir", lambda: site / "properties")
    assert stages.suite_root() == site
    m = Mutant("kernel:x", "rotation-kernel", "properties.mutants.kernel:x", "triton", memory_safety=True)
    first = stages.harness_stages(m)[0]
    assert first.tests == ("properties/rotation",)
    args = stages.build_pytest_args(first, first.tests, "dev")
    assert args[args.index("--rootdir") + 1] == str(site)
    assert args[args.index("--rope-impl") + 1] == m.target and "--hypothesis-profile=dev" in args
    assert "-x" in args and args[args.index("-p", args.index("--rootdir")) + 1] == "rope.harness.mutation.records"


# --------------------------------------------------------------------------- the runner, on a fake pytest
TARGET = "properties.mutants.kernel:neox_for_gptj"
MUTANT = Mutant("kernel:neox_for_gptj", "rotation-kernel", TARGET, "triton")
NODES = [f"properties/baseline/test_engine_style.py::test_mrope_engine_style[{{}}-cpu-{c}]" for c in
         ("glm-1-11", "glm-1-8192", "glm-2-11")]


class FakePytest:
    """Answers the runner's pytest calls from a table, impl -> {node: passed|failed}, by writing
    the records the plugin would write to the file the runner names."""

    def __init__(self, outcomes: dict, seconds: float = 2.0, timeout_after: str | None = None):
        self.outcomes, self.seconds, self.timeout_after, self.calls, self.files = outcomes, seconds, timeout_after, [], []

    def __call__(self, args, timeout_s, env):
        self.calls.append(args)
        assert env["ROPE_CASES_DIR"] == "off" and env["ROPE_NO_REPORT"] == "1"
        assert "rope.harness.mutation.records" in args and os.path.getsize(env[RECORDS_ENV]) == 0
        self.files.append(env[RECORDS_ENV])
        impl = args[args.index("--rope-impl") + 1]
        tests = [a for a in args if a.startswith("properties/")]
        nodes = [n.format(impl) for n in NODES]
        collected = list(nodes) if tests == ["properties/baseline"] else list(tests)
        results = []
        for node in collected:
            results.append((node, self.outcomes[impl][node.split("-cpu-")[1].rstrip("]")]))
            if node.endswith(f"{self.timeout_after}]"):
                results[-1] = (node, "crash")
                write_records(env, fake_records(results, self.seconds, collected=collected, finished=False))
                return RawRun(-9, "", timeout_s, timed_out=True)
            if results[-1][1] == "failed":
                write_records(env, fake_records(results, self.seconds, collected=collected))
                return RawRun(1, "", self.seconds + 1)
        write_records(env, fake_records(results, self.seconds, collected=collected))
        return RawRun(0, "", self.seconds + 1)


def test_failure_the_parent_shares_is_a_false_alarm_and_the_suite_goes_on():
    fake = FakePytest({TARGET: {"glm-1-11": "passed", "glm-1-8192": "failed", "glm-2-11": "failed"},
                       "triton": {"glm-1-8192": "failed", "glm-2-11": "passed"}})
    result = MutationRunner(execute=fake).run_suite(MUTANT, "baseline")
    assert result.status == "caught" and result.test == NODES[2].format(TARGET)
    assert result.false_alarms == [NODES[1].format(TARGET)]
    assert [c.parent_failed for c in result.controls] == [True, False]
    assert result.controls[0].parent_test == NODES[1].format("triton")
    # The mutant's own runs only: 2 runs of 2.0 s pytest time (the controls do not count); the
    # collection comes from the first run's records, no --collect-only run.
    assert [r.outcome for r in result.runs] == ["false-alarm", "caught"]
    assert result.pytest_s == 4.0 and result.suite_s == 4.0 and result.wall_s == 6.0
    assert not any("--collect-only" in call for call in fake.calls) and len(fake.calls) == 4
    assert result.runs[1].command.split()[1] == NODES[2].format(TARGET)     # resumed after the false alarm
    assert result.runs[0].summary == "1 failed, 1 passed" and result.runs[0].tests_run == 2
    assert result.assertion[0].startswith("AssertionError: properties.mutants.broken_rotations:key_unrotated")
    assert result.falsifying_example[0] == "Failing test case: test_rotation_matches_reference("
    # One fresh records file per run, removed once read.
    assert len(set(fake.files)) == 4 and not any(os.path.exists(f) for f in fake.files)


def test_without_control_the_first_failure_counts():
    fake = FakePytest({TARGET: {"glm-1-11": "passed", "glm-1-8192": "failed"}})
    result = MutationRunner(execute=fake, confirm=False).run_suite(MUTANT, "baseline")
    assert result.caught and result.test == NODES[1].format(TARGET) and result.controls == []


def test_suite_that_only_fails_where_the_parent_fails_lets_the_mutant_survive():
    fake = FakePytest({TARGET: {"glm-1-11": "passed", "glm-1-8192": "failed", "glm-2-11": "passed"},
                       "triton": {"glm-1-8192": "failed"}})
    result = MutationRunner(execute=fake).run_suite(MUTANT, "baseline")
    assert result.status == "survived" and not result.caught and result.false_alarms == [NODES[1].format(TARGET)]


def test_failure_not_naming_the_mutant_is_no_catch():
    fake = FakePytest({})
    runner = MutationRunner(execute=fake)
    other = "properties/rotation/test_rotation.py::test_reference_text_tokens_reduce_to_1d"
    stage = Stage("rotation suite", ("properties/baseline",), ("--rope-impl", TARGET), "fail", "--rope-impl")
    result = SuiteResult("harness")
    run = PytestRun.from_records(fake_records([(other, "failed")], 1.0))
    assert runner._judge(MUTANT, stage, RawRun(1, "", 2.0), run, result) == ("unrelated-failure", other)
    assert not fake.calls and result.false_alarms == [other]


def test_timeout_is_not_a_catch():
    fake = FakePytest({TARGET: {"glm-1-11": "passed", "glm-1-8192": "passed"}}, timeout_after="glm-1-8192")
    result = MutationRunner(execute=fake, budget_s=30).run_suite(MUTANT, "baseline")
    assert result.status == "timeout" and not result.caught and result.wall_s == 30
    assert any(f"{NODES[1].format(TARGET)} last" in note for note in result.notes)


def test_catch_over_the_limit_is_flagged_slow():
    fake = FakePytest({TARGET: {"glm-1-11": "failed"}, "triton": {"glm-1-11": "passed"}}, seconds=61.0)
    result = MutationRunner(execute=fake).run_suite(MUTANT, "baseline")
    assert result.caught and result.slow and result.suite_s == 61.0
    assert any("over the 60 s limit" in note for note in result.notes)


POSITIONS_KERNEL = Mutant("kernel:positions_store_unmasked", "positions-kernel", STORE_UNMASKED, "triton",
                          memory_safety=True)
DEDICATED = ("properties/position_step/test_mutant_searches.py::test_position_property_catches_kernel_mutant"
             "[positions_store_unmasked]")
PLAIN = f"properties/position_step/test_runner_positions.py::test_prepared_positions_match_reference[{STORE_UNMASKED}-cpu]"


def test_position_kernel_mutants_run_guarded_first_with_what_raises_caught():
    # Unguarded, a position kernel writing past its output corrupts the test process (a crash,
    # or a hang until the budget is spent): the guarded dedicated test runs first.
    calls = []

    def fake(args, timeout_s, env):
        calls.append(args)
        assert "--rope-position-step-impl" not in args
        write_records(env, fake_records([(DEDICATED, "passed")], 1.98, caught=[DISPATCH_CAUGHT]))
        return RawRun(0, "", 4.0)
    result = MutationRunner(execute=fake).run_suite(POSITIONS_KERNEL, "harness")
    assert [r.outcome for r in result.runs] == ["caught"] and len(calls) == 1
    assert result.caught and result.stage.startswith("dedicated search") and result.test == DEDICATED
    assert result.suite_s == 1.98 and result.wall_s == 4.0
    assert result.assertion[0].startswith("AssertionError: MRopeCachedCosSin platform=xpu")
    assert result.falsifying_example[1] == "    combo=('mrope-chunked', 'xpu', 'eager'),"
    assert result.excerpt.splitlines()[1].startswith("case: RotationCase(")


def test_a_crash_is_no_catch_unless_a_failure_was_recorded_before_it():
    def dedicated_fails(args, timeout_s, env):
        if "--rope-position-step-impl" in args:          # the plain suites: dies in its first test
            write_records(env, fake_records([(PLAIN, "crash")], 0.0))
            return RawRun(-11, "Fatal Python error: Segmentation fault", 3.0)
        write_records(env, fake_records([(DEDICATED, "failed")], 1.0, exception=DID_NOT_RAISE))
        return RawRun(1, "", 2.0)
    crashed = MutationRunner(execute=dedicated_fails).run_suite(POSITIONS_KERNEL, "harness")
    assert [r.outcome for r in crashed.runs] == ["passed", "crashed"] and crashed.status == "crashed"
    assert crashed.runs[1].failing_test == PLAIN and crashed.suite_s == 1.0 + 3.0
    assert any("DID NOT RAISE" in note for note in crashed.notes)
    assert any("SIGSEGV (Segmentation fault)" in note and PLAIN in note for note in crashed.notes)

    def fails_then_dies(args, timeout_s, env):
        if "--rope-position-step-impl" in args:          # a failure recorded, then the process dies
            write_records(env, fake_records([(PLAIN, "failed")], 0.0, finished=False))
            return RawRun(-11, "", 3.0)
        write_records(env, fake_records([(DEDICATED, "failed")], 1.0, exception=DID_NOT_RAISE))
        return RawRun(1, "", 2.0)
    caught = MutationRunner(execute=fails_then_dies, confirm=False).run_suite(POSITIONS_KERNEL, "harness")
    assert caught.caught and caught.test == PLAIN and caught.stage == "position suites"
    assert any("the process then died: killed by SIGSEGV" in note for note in caught.notes)

    def nothing_fails(args, timeout_s, env):
        node = PLAIN if "--rope-position-step-impl" in args else DEDICATED
        write_records(env, fake_records([(node, "passed" if node == PLAIN else "failed")], 1.0,
                                        exception=DID_NOT_RAISE))
        return RawRun(0 if node == PLAIN else 1, "", 2.0)
    survived = MutationRunner(execute=nothing_fails).run_suite(POSITIONS_KERNEL, "harness")
    assert survived.status == "survived" and not survived.caught


def test_a_real_crash_after_a_failure_is_judged_from_its_records(tmp_path):
    # A real pytest whose test fails and whose teardown then kills the process.
    test_file = tmp_path / "test_dies_after.py"
    test_file.write_text(textwrap.dedent(f"""
        import os, signal, pytest

        @pytest.fixture
        def dies():
            yield
            os.kill(os.getpid(), signal.SIGSEGV)

        @pytest.mark.parametrize("impl", ["{TARGET}"])
        def test_rotation(impl, dies):
            assert False, "rotation does not match the reference"
        """))

    def execute(args, timeout_s, env):
        proc = subprocess.run([sys.executable, "-m", "pytest", str(test_file), "-x", "-p", records.PLUGIN,
                               "-p", "no:cacheprovider"], cwd=tmp_path, env=subprocess_env(env), capture_output=True,
                              text=True)
        return RawRun(proc.returncode, proc.stdout + proc.stderr, 1.0)
    result = MutationRunner(execute=execute, confirm=False).run_suite(MUTANT, "harness")
    assert result.runs[0].returncode == -signal.SIGSEGV
    assert result.caught and result.test == f"test_dies_after.py::test_rotation[{TARGET}]"
    assert result.assertion == ["AssertionError: rotation does not match the reference"]
    assert any("then died: killed by SIGSEGV" in note for note in result.notes)


def test_logs_keep_the_output_and_the_records(tmp_path):
    fake = FakePytest({TARGET: {"glm-1-11": "failed"}})
    MutationRunner(execute=fake, confirm=False, log_dir=tmp_path).run_suite(MUTANT, "baseline")
    log, = tmp_path.glob("*.log")
    jsonl, = tmp_path.glob("*.jsonl")
    assert log.name == "kernel_neox_for_gptj.baseline.0.log" and log.read_text().startswith("$ pytest properties/")
    assert PytestRun.from_records(read_records(jsonl)).failed == [NODES[0].format(TARGET)]


# --------------------------------------------------------------------------- reports and exit status
def _two_results():
    fake = FakePytest({TARGET: {"glm-1-11": "passed", "glm-1-8192": "failed", "glm-2-11": "failed"},
                       "triton": {"glm-1-8192": "failed", "glm-2-11": "passed"}})
    caught = MutantResult(MUTANT, MutationRunner(execute=fake).run_suite(MUTANT, "baseline"))
    caught.harness.suite = "harness"
    alive = MutantResult(Mutant("dispatch:x", "dispatch", "properties.mutants.dispatch:X", None, "doc | pipe"),
                         SuiteResult("harness", status="survived", notes=["nothing failed"]))
    return MutationReport([caught, alive], "ci", 60.0, 300.0, 2, True, True, 12.5, "2025-01-01T00:00:00")


def test_a_mutant_this_machine_cannot_show_is_listed_not_run(monkeypatch):
    # offsets_32bit needs a GPU: on a machine without one it is named, with the reason, and neither
    # run nor counted (no survivor, no change to the exit status).
    from rope.harness.mutation import runner as runner_module
    monkeypatch.setattr("rope.devices.available_devices", lambda: ["cpu"])
    gpu_only = [m for m in mutation.discover_mutants() if m.needs == "gpu-deep"]
    assert [m.name for m in gpu_only] == ["kernel:offsets_32bit", "kernel:cache_offsets_32bit"]
    assert catalogue.unmet_need(gpu_only[0]).startswith("needs a GPU")
    rep = runner_module.run(["offsets_32bit"], baseline=False, execute=lambda *a, **k: pytest.fail("ran"))
    assert rep.results == [] and rep.summary()["not_run"][0]["mutant"] == "kernel:offsets_32bit"
    assert mutation.exit_code(rep) == 0 and any(line.startswith("not run here: kernel:offsets_32bit")
                                                for line in report.summary_lines(rep))
    monkeypatch.setattr("rope.devices.available_devices", lambda: ["cpu", "cuda"])
    assert catalogue.unmet_need(gpu_only[0]) is None


def test_reports_are_written_atomically_and_well_formed(tmp_path):
    rep = _two_results()
    paths = report.write_reports(rep, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mutants.json", "mutants.md"] == sorted(p.name for p in paths)
    data = json.loads(paths[0].read_text())
    assert data["schema"] == mutation.SCHEMA == "rope-harness/mutants/1" and data["total_wall_s"] == 12.5
    assert [m["name"] for m in data["mutants"]] == ["kernel:neox_for_gptj", "dispatch:x"]
    first = data["mutants"][0]
    assert set(first) == {"name", "kind", "target", "parent", "doc", "memory_safety", "needs", "dedicated",
                          "harness", "baseline", "drawn"}
    assert first["harness"]["caught"] is True and first["harness"]["false_alarms"] == [NODES[1].format(TARGET)]
    assert first["harness"]["runs"][0]["outcome"] == "false-alarm" and first["baseline"] is None
    assert data["mutants"][1]["dedicated"] is True and data["mutants"][1]["harness"]["caught"] is False
    assert data["summary"]["harness"]["caught"] == 1 and data["summary"]["survivors"] == ["dispatch:x"]
    md = paths[1].read_text()
    assert "| mutant | kind | harness caught? |" in md
    assert "| `kernel:neox_for_gptj` | rotation-kernel | yes 1 false alarm skipped | 6.0 / 4.0 | n/a | - |" in md
    assert "| `dispatch:x` | dispatch (dedicated test) | NO (survived) |" in md
    assert "doc \\| pipe" not in md.split("## Details")[0] and "dedicated tests in properties/dispatch" in md
    assert "```text\nAssertionError: properties.mutants.broken_rotations:key_unrotated" in md
    assert exit_code(rep) == 1
    rep.results.pop()
    assert exit_code(rep) == 0


def test_the_drawn_cases_alone_run_each_stage_without_the_fixed_cases_and_have_their_own_column(tmp_path):
    # The drawn-only suite: every stage of the harness's, its pytest run deselecting the tests marked
    # fixed_cases and loading the profile without @example cases; its result has its own column and
    # summary line, and a mutant only the fixed cases catch makes the exit status 1.
    from hypothesis import Phase, settings
    from rope.harness.mutation import stages as stages_module
    stages = stages_module.drawn_stages(MUTANT)
    assert [s.tests for s in stages] == [s.tests for s in stages_module.harness_stages(MUTANT)] and all(s.drawn for s in stages)
    args = stages_module.build_pytest_args(stages[0], stages[0].tests, "ci")
    assert args[args.index("-m") + 1] == "not fixed_cases" and "--hypothesis-profile=ci-drawn" in args
    assert Phase.explicit not in settings.get_profile("ci-drawn").phases
    assert settings.get_profile("ci-drawn").derandomize and Phase.explicit in settings.get_profile("ci").phases
    plain = stages_module.build_pytest_args(stages_module.harness_stages(MUTANT)[0], (), "ci")
    assert "-m" not in plain and "--hypothesis-profile=ci" in plain
    gpu_deep = next(m for m in mutation.discover_mutants() if m.needs == "gpu-deep")
    assert stages_module.drawn_stages(gpu_deep) == []
    # A memory-safety mutant's guarded search is drawn: without the guarded fixed triggers it goes first.
    unmasked = next(m for m in mutation.discover_mutants() if m.name == "kernel:cos_sin_unmasked")
    assert stages_module.harness_stages(unmasked)[0].caught_when == "fail"
    assert stages_module.drawn_stages(unmasked)[0].caught_when == "pass"
    rep = _two_results()
    rep.drawn = True
    rep.results[0].drawn = SuiteResult("drawn", status="survived", wall_s=300.0)
    md = report.markdown(rep)
    assert "| harness caught? | s (wall / pytest) | drawn only? | s (wall / pytest) | baseline caught? |" in md
    assert any(line.startswith("drawn cases alone: caught 0/1 mutants") and "not caught: kernel:neox_for_gptj" in line
               for line in report.summary_lines(rep))
    rep.results.pop()
    assert exit_code(rep) == 1         # the harness caught it; the drawn cases alone did not
    rep.results[0].drawn.status = "caught"
    assert exit_code(rep) == 0


def test_every_fixed_case_test_is_marked_and_every_drawn_test_is_not():
    # The drawn-only column is honest only if the tests made of hand-written cases carry fixed_cases
    # and the searches do not: a test is a search when Hypothesis drives it (@given or a state
    # machine), and a search must not carry the marker.
    import ast
    from rope.harness.suite import suite_dir
    searches, fixed = set(), set()
    for path in suite_dir().rglob("test_*.py"):
        for node in ast.parse(path.read_text()).body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            decorators = [ast.unparse(d) for d in node.decorator_list]
            source = ast.unparse(node)
            if any(d.startswith("given") for d in decorators) or "run_state_machine_as_test" in source:
                searches.add(node.name)
            if "pytest.mark.fixed_cases" in decorators:
                fixed.add(node.name)
    assert not searches & fixed, searches & fixed
    assert {"test_known_bug_triggers_match_reference", "test_regression_case_matches_reference",
            "test_model_rotation_matches_reference", "test_power_of_two_boundaries_match_reference",
            "test_known_bug_prompts_match"} <= fixed


def test_table_shows_each_mutant_and_the_summary():
    from rich.console import Console
    console = Console(record=True, width=220)
    report.print_table(_two_results(), console)
    text = console.export_text()
    assert "kernel:neox_for_gptj" in text and "(dedicated test)" in text and "NO (survived)" in text
    assert "harness: caught 1/2 mutants (1/1 rotation mutants)" in text
    assert "survivors of the harness: dispatch:x" in text and "nothing failed" in text


def test_cli_rejects_an_unknown_mutant(tmp_path, capsys):
    assert mutation.main(["--only", "no_such_bug", "--out", str(tmp_path)]) == 2
    assert "no such mutant" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_cli_lists_the_mutants_and_their_stages(capsys):
    assert mutation.main(["--list", "--only", "positions_store_unmasked"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kernel:positions_store_unmasked  [positions-kernel (memory)]")
    assert out.index("dedicated search (position_step)") < out.index("position suites")


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
    assert harness["test"].startswith("properties/rotation/test_rotation.py::") and KEY_UNROTATED in harness["test"]
    assert "does not match the reference" in harness["assertion"][0] and "key_only" in harness["assertion"][1]
    # The known-bug triggers run first (conftest): a fixed case, so no Hypothesis example to shrink.
    assert "test_known_bug_triggers" in harness["test"] and harness["falsifying_example"] == []
    assert harness["controls"][0]["parent_failed"] is False and "[native-cpu-" in harness["controls"][0]["parent_test"]
    assert 0 < harness["pytest_s"] <= harness["wall_s"]
    assert harness["runs"][0]["summary"] == "1 failed" and harness["runs"][0]["tests_run"] == 1
    assert "| `broken_rotations:key_unrotated` | rotation | yes |" in (tmp_path / "mutants.md").read_text()


def test_the_markdown_is_what_the_json_renders_whatever_the_rounding(tmp_path):
    # The JSON keeps a total wall time to 0.01 s; the markdown shows it to 0.1 s.  737.849 s is 737.85
    # in the JSON: the markdown must say what that renders, not what the unrounded figure does.
    rep = _two_results()
    rep.total_wall_s = 737.849
    json_path, md_path = report.write_reports(rep, tmp_path)
    rendered = report.markdown(mutation.MutationReport.from_dict(json.loads(json_path.read_text())))
    assert md_path.read_text() == rendered and "total wall time 737.9 s" in rendered
