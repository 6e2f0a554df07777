"""rope.harness.stack: the stack found here judged against the supported range, as
``rope-harness devices`` prints it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from rope.harness import stack

pytestmark = pytest.mark.stack      # meets the installed torch and Triton: CI runs it on every stack (.ci/run)


@pytest.mark.parametrize("version, verdict", [
    ("2.11.0", "supported"), ("2.13.0+cpu", "supported"), ("2.12.1+cu130", "supported"),
    ("2.10.2", "not supported"), ("1.13.0", "not supported"), ("2.14.1", "newer than tested"),
    ("nightly", "unknown version"), (None, "not supported"),
])
def test_a_required_package_is_judged_by_its_range(version, verdict):
    found = stack.judge("torch", version, (2, 11), (2, 13))
    assert found.verdict == verdict, found
    assert found.ok is (verdict in ("supported", "newer than tested"))


def test_an_optional_package_missing_is_fine_and_names_its_extra():
    found = stack.judge("transformers", None, (5, 12), (5, 25), "oracle")
    assert found.ok and found.verdict == "not installed" and "rope-harness[oracle]" in found.note


def test_the_pyproject_lower_bounds_are_the_supported_range():
    pyproject = (stack.__file__.rsplit("/rope/", 1)[0] + "/pyproject.toml")
    try:
        text = open(pyproject).read()
    except OSError:
        pytest.skip("an installed wheel carries no pyproject.toml")
    for package in ("torch", "triton"):
        oldest = stack.SUPPORTED[package][0]
        assert f'"{package}>={oldest[0]}.{oldest[1]}"' in text, package


def test_devices_prints_this_stack_and_its_verdict():
    run = subprocess.run([sys.executable, "-m", "rope.harness.cli", "devices"], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    import importlib.metadata
    torch_version = importlib.metadata.version("torch")       # as installed (torch.__version__ may add +cu130)
    assert re.search(rf"^\s+torch\s+{re.escape(torch_version)}\s", run.stdout, re.M), run.stdout
    assert re.search(r"^stack: (supported|NOT supported \(.+\))$", run.stdout, re.M), run.stdout
    verdict_ok = all(f.ok for f in stack.stack())
    assert ("stack: supported" in run.stdout) is verdict_ok
