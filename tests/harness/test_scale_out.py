"""Scale-out: shards partition the suite, workers and tests spread over GPUs, campaigns stop on
time and merge what every worker found, reports of several runners merge into one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import example, given, strategies as st

from rope.harness import plugin
from rope.harness import placement, report
from rope.devices import torch_device
from rope.harness.sharding import parse_shard, shard_of

ROOT = Path(__file__).resolve().parents[2]
test_ids = st.lists(st.text(min_size=1, max_size=40), min_size=0, max_size=60, unique=True)


# ------------------------------------------------------------------ sharding
@given(ids=test_ids, count=st.integers(1, 9))
@example(ids=["properties/rotation/test_rotation.py::test_x[triton-cuda:1-bf16]"], count=1)
def test_shards_partition_the_tests(ids, count):
    shards = [[t for t in ids if shard_of(t, count) == i] for i in range(count)]
    assert sorted(t for s in shards for t in s) == sorted(ids)          # every test exactly once
    assert all(0 <= shard_of(t, count) < count for t in ids)


@pytest.mark.parametrize("text", ["3/3", "-1/2", "1", "a/b", "0/0", "", "1/2/3"])
def test_bad_shard_is_a_clear_error(text):
    with pytest.raises(ValueError, match=r"shard=.*must be I/N"):
        parse_shard(text)


def _collect(*args: str) -> list[str]:
    env = {**os.environ, report.DISABLE_ENV: "1"}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "properties/rotation/test_rotation.py", *args],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if "::" in line]


@pytest.mark.needs_no_gpu          # pytest sessions that only collect
def test_shard_option_runs_every_collected_test_exactly_once():
    everything = _collect()
    shards = [_collect(f"--rope-shard={i}/3") for i in range(3)]
    assert all(shards), "a shard of 107 tests came out empty"
    assert Counter(t for s in shards for t in s) == Counter(everything)
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--rope-shard=3/3",
                          "properties/rotation/test_rotation.py"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, report.DISABLE_ENV: "1"})
    assert out.returncode != 0 and "--rope-shard" in out.stdout + out.stderr


# ------------------------------------------------------------------ pinning (simulated devices)
@given(num_gpus=st.integers(1, 16), workers=st.integers(1, 64))
def test_workers_take_distinct_gpus_round_robin(num_gpus, workers):
    got = [placement.worker_gpu(f"gw{i}", num_gpus) for i in range(workers)]
    # The first min(workers, GPUs) workers each own a different GPU; the rest cycle evenly.
    assert len(set(got[:num_gpus])) == min(workers, num_gpus)
    assert all(0 <= g < num_gpus for g in got)
    counts = Counter(got)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert placement.worker_gpu(None, num_gpus) == 0 and placement.worker_gpu("gw3", 0) is None


def test_auto_workers_is_one_per_gpu_plus_cpu_workers():
    assert placement.auto_workers(num_gpus=2, cores=32) == 32       # 2 GPU workers + 30 CPU workers
    assert placement.auto_workers(num_gpus=8, cores=4) == 8         # never fewer workers than GPUs
    assert placement.auto_workers(num_gpus=0, cores=2) == 2
    assert placement.auto_workers(num_gpus=0, cores=0) == 1


def test_auto_workers_yield_to_xdists_own_variable(monkeypatch):
    # `-n auto` takes the harness's count (GPUs plus CPU workers) unless the user set
    # PYTEST_XDIST_AUTO_NUM_WORKERS, pytest-xdist's documented way to fix it: then the harness returns
    # no count and xdist's own hook reads the variable (a CI box sharing its cores, or the doc-test's
    # commands run beside the suite).  Rejects a hook that answers first regardless.
    config = SimpleNamespace(_rope_active=True)
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    assert plugin.pytest_xdist_auto_num_workers(config) == placement.auto_workers(placement.gpu_count(),
                                                                                  placement.usable_cores())
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert plugin.pytest_xdist_auto_num_workers(config) is None


def test_visible_gpu_count_is_torchs(monkeypatch):
    # torch's device count honours CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES / ZE_AFFINITY_MASK.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert placement.gpu_count("cuda") == 3 and placement.gpu_count("rocm") == 3
    assert placement.gpu_count("cpu") == 0


@pytest.mark.parametrize("label,parsed", [("cpu", ("cpu", None)), ("cuda", ("cuda", None)), ("cuda:1", ("cuda", 1)),
                                          ("rocm:0", ("rocm", 0)), ("xpu:7", ("xpu", 7))])
def test_device_labels_parse(label, parsed):
    assert placement.parse_device(label) == parsed


@pytest.mark.parametrize("label", ["cpu:0", "gpu", "cuda:-1", "cuda:x", "", "cuda:1:2"])
def test_bad_device_label_is_a_clear_error(label):
    with pytest.raises(ValueError, match=r"device=.*must be one of"):
        placement.parse_device(label)


class _FakeItem(SimpleNamespace):
    def get_closest_marker(self, name):
        return self.marks.get(name)


def _fake_items(tests: list[str], gpus: list[int], kind: str = "cuda") -> list[_FakeItem]:
    """What collection yields for GPU tests on len(gpus) GPUs: one copy per GPU, plus CPU tests."""
    items = []
    for t in tests:
        items.append(_FakeItem(nodeid=f"{t}[triton-cpu-bf16]", marks={}))
        for g in gpus:
            items.append(_FakeItem(nodeid=f"{t}[triton-{kind}:{g}-bf16]",
                                   marks={"rope_gpu": SimpleNamespace(args=(kind, g))}))
    return items


@given(tests=st.lists(st.from_regex(r"test_[a-z]{1,8}", fullmatch=True), min_size=1, max_size=40, unique=True),
       num_gpus=st.integers(1, 8))
def test_each_gpu_test_runs_once_and_tests_spread_over_the_gpus(tests, num_gpus):
    items = _fake_items(tests, list(range(num_gpus)))
    kept = list(items)
    plugin.keep_one_gpu_per_test(kept)
    gpu_kept = [i for i in kept if i.marks]
    assert len(gpu_kept) == len(tests)                                  # each GPU test once
    assert len([i for i in kept if not i.marks]) == len(tests)          # CPU tests untouched
    per_gpu = Counter(i.marks["rope_gpu"].args[1] for i in gpu_kept)
    assert max(per_gpu.values()) - min(per_gpu.values(), default=0) <= 1
    assert len(per_gpu) == min(num_gpus, len(tests))
    for item in gpu_kept:                                                # the id says where it runs
        assert f"cuda:{item.marks['rope_gpu'].args[1]}" in item.nodeid
    again = list(items)
    plugin.keep_one_gpu_per_test(again)                               # every xdist worker agrees
    assert [i.nodeid for i in again] == [i.nodeid for i in kept]


def test_gpu_copy_key_only_drops_the_gpu_index():
    item = _FakeItem(nodeid="t.py::test_x[native-cuda:10-cuda:1-chunked]",
                     marks={"rope_gpu": SimpleNamespace(args=("cuda", 1))})
    assert plugin.gpu_copy_key(item) == "t.py::test_x[native-cuda:10-cuda-chunked]"


@pytest.mark.gpu
def test_gpu_tests_run_on_the_gpu_in_their_id(device, request):
    # On a box with several GPUs each copy of this test is assigned one; inside it that GPU is
    # the current device, so tensors on "cuda" and kernels launched there land on it.
    if device == "cpu":
        pytest.skip("needs a GPU")
    kind, index = request.node.get_closest_marker("rope_gpu").args
    assert f"{kind}:{index}" in request.node.nodeid
    x = torch.ones(4, device=torch_device(kind))
    assert x.device.index == index and placement.device_label(kind) == f"{kind}:{index}"


# ------------------------------------------------------------------ reports: placement and merge
def _comparison_record(worker: str, device: str, ok: bool = True, case_file: str | None = None) -> dict:
    return {"kind": "comparison", "test": "t", "impl": "triton", "device": device, "dtype": "bfloat16",
            "variant": "1d-neox", "ok": ok, "worst_ratio": 0.5 if ok else "inf", "mismatched": 0 if ok else 3,
            "elements": 64, "problems": [], "case_file": case_file, "heat": None, "worker": worker}


def test_report_shows_which_workers_ran_on_which_gpu():
    records = [_comparison_record(f"gw{w}", f"cuda:{w % 2}") for w in range(6)] + [_comparison_record("gw9", "cpu")]
    summary = report.summarize(records)
    placed = {p["device"]: p for p in summary["placement"]}
    assert placed["cuda:0"] == {"device": "cuda:0", "examples": 3, "workers": ["gw0", "gw2", "gw4"]}
    assert placed["cuda:1"]["workers"] == ["gw1", "gw3", "gw5"] and placed["cpu"]["examples"] == 1
    md = report.markdown(summary, [])
    assert "## Where it ran" in md and "| cuda:1 | 3 | gw1, gw3, gw5 |" in md
    assert report.worker_ranges(["gw0", "gw1", "gw2", "gw5", "main"]) == "gw0-gw2, gw5, main"


def test_reports_of_several_runners_merge(tmp_path):
    host_a, host_b, out = tmp_path / "a", tmp_path / "b", tmp_path / "merged"
    report.write_report([_comparison_record("gw0", "cuda:0"), _comparison_record("gw1", "cuda:1")], host_a, run="a")
    (host_b / "cases").mkdir(parents=True)
    (host_b / "cases" / "abc.json").write_text('{"id": "abc"}')
    report.write_report([_comparison_record("gw0", "cpu", ok=False, case_file=str(host_b / "cases" / "abc.json"))],
                        host_b, run="b")
    paths = report.merge([host_a, host_b], out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["examples"] == 3 and summary["failures"] == 1 and summary["run"] == ["a", "b"]
    assert {p["device"] for p in summary["placement"]} == {"cuda:0", "cuda:1", "cpu"}
    assert (out / "cases" / "abc.json").read_text() == '{"id": "abc"}'
    assert str(out / "cases" / "abc.json") in (out / "summary.md").read_text()
    assert paths[0] == out / "summary.md"
    with pytest.raises(ValueError, match=r"input=.*no records.jsonl"):
        report.merge([tmp_path / "nothing"], out)


def test_merge_command_exits_nonzero_when_a_runner_failed(tmp_path):
    from rope.harness.cli import main
    report.write_report([_comparison_record("gw0", "cpu")], tmp_path / "a")
    assert main(["merge", str(tmp_path / "m1"), str(tmp_path / "a")]) == 0
    report.write_report([_comparison_record("gw0", "cpu", ok=False)], tmp_path / "b")
    assert main(["merge", str(tmp_path / "m2"), str(tmp_path / "a"), str(tmp_path / "b")]) == 1


# ------------------------------------------------------------------ campaign
def test_examples_schedule_deepens_to_the_cap():
    from itertools import islice

    from rope.harness.campaign import examples_schedule
    assert list(islice(examples_schedule(2000), 6)) == [20, 80, 320, 1280, 2000, 2000]
    assert list(islice(examples_schedule(5), 2)) == [5, 5]


def test_a_campaign_names_its_host_beside_its_rate():
    # Two GPUs of one kind check cases at rates up to twice apart on different hosts (the host's
    # cores do most of a case's work): the report says which host a rate was measured on.
    from rope.harness.campaign import Campaign, host_description, markdown
    two_cores = ("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R)  Xeon(R) Processor\n\n"
                 "processor\t: 1\nmodel name\t: Intel(R)  Xeon(R) Processor\n")
    assert re.fullmatch(r"[1-9]\d* CPUs \(Intel\(R\) Xeon\(R\) Processor\)", host_description(two_cores))
    assert re.fullmatch(r"[1-9]\d* CPUs \(\S.*\)", host_description("processor\t: 0\n"))   # no model name: the machine's
    data = Campaign(minutes=2, devices=["cuda:0"], workers="auto", tests=[], out="o",
                    host="16 CPUs (Intel(R) Xeon(R) Processor)").to_dict() | {"examples_per_s": 5045.1}
    assert "Host: 16 CPUs (Intel(R) Xeon(R) Processor)." in markdown(data)
    assert "Host:" not in markdown(data | {"host": ""})


def test_campaign_rounds_share_one_example_database(tmp_path):
    from hypothesis.database import DirectoryBasedExampleDatabase

    from rope.harness.campaign_settings import campaign_profile
    kwargs = campaign_profile({"ROPE_CAMPAIGN_EXAMPLES": "320", "ROPE_HYPOTHESIS_DB": str(tmp_path / "db")})
    assert kwargs["max_examples"] == 320 and kwargs["deadline"] is None
    assert isinstance(kwargs["database"], DirectoryBasedExampleDatabase)
    assert Path(kwargs["database"].path) == tmp_path / "db"
    assert "database" not in campaign_profile({})           # outside a campaign: Hypothesis' default


def test_campaign_rounds_come_from_the_environment():
    from rope.harness.campaign_settings import ROUNDS_ENV, campaign_rounds
    assert campaign_rounds({ROUNDS_ENV: "20:7, 80:9"}) == [(20, 7), (80, 9)]
    assert campaign_rounds({}) == []
    for bad in ("20", "x:1", "0:3", "20:1,80"):
        with pytest.raises(ValueError, match=ROUNDS_ENV):
            campaign_rounds({ROUNDS_ENV: bad})


@pytest.mark.parametrize("nodeid,expected", [
    ("t.py::t[round0-native-cpu]", "t.py::t[native-cpu]"), ("t.py::t[native-round12]", "t.py::t[native]"),
    ("t.py::t[round3]", "t.py::t"), ("t.py::t[background1-x]", "t.py::t[background1-x]")])
def test_a_rounds_database_key_is_the_test_without_its_round(nodeid, expected):
    assert plugin.without_round(nodeid) == expected


@pytest.mark.needs_no_gpu          # a pytest session pinned to the CPU
def test_campaign_rounds_run_in_one_session_with_their_own_examples(tmp_path):
    # Two rounds of 3 and 5 examples: each Hypothesis test runs once per round, in round order,
    # with that round's examples (8 comparisons); the fixed cases run once.
    from rope.harness.campaign_settings import CAMPAIGN_ENV, EXAMPLES_ENV, ROUNDS_ENV
    run_dir = tmp_path / "records"
    env = {**os.environ, CAMPAIGN_ENV: "1", EXAMPLES_ENV: "3", ROUNDS_ENV: "3:11,5:12", report.RUN_ENV: str(run_dir),
           "ROPE_CASES_DIR": "off"}
    env.pop(report.DISABLE_ENV, None)
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--hypothesis-profile=campaign",
            "--rope-impl", "native", "--rope-device", "cpu", "properties/rotation/test_rotation.py", "-k",
            "test_rotation_matches_reference and fp32-chunked3-neox or test_large_batches or "
            "test_known_bug_triggers_match_reference and qwen3vl"]
    proc = subprocess.run(args + ["-v"], env=env, capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = [line.split(" ")[0] for line in proc.stdout.splitlines() if " PASSED" in line]
    assert [t.split("[")[1][:7] for t in ran if "matches_reference[round" in t] == ["round0-", "round1-"]
    rounds = [int(t.split("[round")[1].split("-")[0]) for t in ran if "[round" in t]
    assert rounds == sorted(rounds) == [0, 0, 1, 1], ran        # every test's round 0 before any round 1
    assert sum("known_bug" in t for t in ran) == 1
    records = [r for r in report.load_records(run_dir) if r.get("kind") == "comparison"
               and "test_rotation_matches_reference" in r["test"]]
    assert len(records) == 3 + 5
    profiles = [r for r in report.load_records(run_dir) if r.get("kind") == "profile" and r["final"]]
    assert len(profiles) == 1 and profiles[0]["counts"]["call"] + profiles[0]["counts"].get("jit", 0) >= 8


def test_campaign_rejects_bad_budgets():
    from rope.harness.campaign import run_campaign
    with pytest.raises(ValueError, match="minutes=0"):
        run_campaign(0)
    with pytest.raises(ValueError, match="max_examples=0"):
        run_campaign(1, max_examples=0)


@pytest.mark.slow
@pytest.mark.needs_no_gpu          # a pytest session pinned to the CPU
def test_campaign_on_cpu_stops_on_time_and_merges_every_workers_records(tmp_path, monkeypatch):
    from rope.harness import table_store
    from rope.harness.campaign import GRACE_S, run_campaign
    monkeypatch.setenv("ROPE_REPORTS_DIR", str(tmp_path))
    monkeypatch.delenv("CI", raising=False)          # the campaign profile, not ci, in the rounds
    stores = []                                      # the workers' table store, made and removed by each campaign
    make = table_store.make_store
    monkeypatch.setattr(table_store, "make_store", lambda: stores.append(make()) or stores[-1])
    # On a machine busy with other work (a GPU box's suite on every core) the two workers may not
    # reach their first example in 15 s: a longer budget then, each run held to its own; where not
    # even the longest is enough, the merge cannot be seen here and the test says so.
    for budget_s in (15.0, 45.0, 120.0):
        c = run_campaign(budget_s / 60, devices=["cpu"], workers="2", tests=["rotation/test_rotation.py"], out=tmp_path / "c",
                         seed=7, pytest_args=["-k", "test_rotation_matches_reference and native"],
                         show_progress=False)
        # On time, by the campaign's own clock: every round but the last ended before the deadline,
        # and the last ended by itself or was stopped there, within the stop's escalation
        # (SIGINT, then SIGTERM and SIGKILL 10 s apart) and one poll.  No bound on how fast the machine is.
        assert c.runs and sum(r.wall_s for r in c.runs[:-1]) < budget_s, [r.wall_s for r in c.runs]
        assert c.runs[-1].interrupted or all(r.exit_code == 0 for r in c.runs)
        assert c.wall_s < budget_s + GRACE_S + 20 + 1, f"campaign took {c.wall_s:.0f} s for a {budget_s:.0f} s budget"
        assert stores and not any(store.exists() for store in stores)
        data = json.loads((tmp_path / "c" / "campaign.json").read_text())
        if data["examples"]:
            break
    else:
        # Skipped only where no test of any round finished either; a round that passed a test with
        # no example counted is a campaign that lost its records.
        logs = "".join(Path(r.log).read_text(errors="replace") for r in c.runs)
        assert not re.search(r"\b[1-9]\d* passed", logs), logs[-3000:]
        pytest.skip(f"no worker reached its first example within {budget_s:.0f} s: this machine is too busy "
                    "to see the campaign merge its workers' records")
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert data["examples"] == summary["examples"] > 0 and data["failures"] == 0
    assert set(data["per_device"]["cpu"]["workers"]) == {"gw0", "gw1"}      # both workers' records merged
    assert (tmp_path / "c" / "campaign.md").read_text().count("| cpu |") == 1
    from rope.harness.campaign import host_description
    assert data["host"] == host_description() and f"Host: {data['host']}." in (tmp_path / "c" / "campaign.md").read_text()


@pytest.mark.needs_no_gpu          # a pytest session pinned to the CPU
def test_a_default_campaign_searches_the_rotation_and_position_step_packages_without_the_prefill_sizes(tmp_path):
    # The defaults are the suite's sub-packages, narrowed by marker (no file list): the prefill sizes
    # are left out in every session, the fixed cases after the first.  A user's own -m replaces both.
    from rope.harness import campaign
    from rope.harness.suite import suite_path
    c = campaign.Campaign(minutes=1, devices=["cpu"], workers="0", out=str(tmp_path),
                          tests=[str(suite_path(t)) for t in campaign.DEFAULT_TESTS], select=campaign.DEFAULT_SELECTION)
    run = campaign.Run(seeds=[1], examples_per_test=[10], log=str(tmp_path / "log"))
    first = campaign._pytest_command(c, run, [])
    later = campaign._pytest_command(c, run, [], searches_only=True)
    def marks(cmd):         # the value of the last -m (the first is python's own: -m pytest)
        return cmd[len(cmd) - 1 - cmd[::-1].index("-m") + 1]
    assert marks(first) == "(not prefill)" and marks(later) == "(not prefill) and hypothesis"
    assert [Path(t).name for t in c.tests] == ["rotation", "position_step"]
    own = campaign._pytest_command(c, run, ["-m", "rotation"], searches_only=True)
    assert own.count("-m") == 2 and own[-1] == "rotation"        # pytest's own -m, then the user's
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                *c.tests, "-m", "(not prefill)", "--rope-device", "cpu"],
                               cwd=ROOT, capture_output=True, text=True, timeout=300)
    files = {line.split("::")[0] for line in collected.stdout.splitlines() if "::" in line}
    assert "properties/rotation/test_rotation.py" in files and "properties/position_step/test_runner_positions.py" in files
    assert not any("test_prefill" in f for f in files), files
