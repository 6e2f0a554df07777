"""The software stack found here, and whether the harness supports it.

CI runs the suite on two stacks, each installed from the project's own files in a fresh
environment (.ci/run): the newest releases, and the torch / Triton pair the current vLLM release
pins.  ``SUPPORTED`` is that range, for the packages whose version changes what the harness does
(torch's operators, Triton's compiler and interpreter, transformers' position-id code); the lower
bounds are pyproject.toml's too.  A version between the two is supported, one below the range is
not (the harness may still run, and says so), one above it is newer than anything tested.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
from dataclasses import dataclass

# package -> (oldest supported, newest tested), as (major, minor); the extra that installs it, if any.
SUPPORTED = {
    "torch": ((2, 11), (2, 13), None),
    "triton": ((3, 6), (3, 9), None),
    "transformers": ((5, 12), (5, 25), "oracle"),
    "liger-kernel": ((0, 6), (0, 8), "backends"),
}
PYTHON = ((3, 10), (3, 12))
# Distributions that provide the `triton` module on vendor builds of torch.
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton-rocm", "pytorch-triton-xpu", "triton-xpu", "pytorch-triton")


@dataclass(frozen=True)
class Found:
    package: str
    version: str | None          # None: not installed
    verdict: str                 # "supported", "not supported", "newer than tested", "not installed", "unknown version"
    note: str

    @property
    def ok(self) -> bool:
        return self.verdict in ("supported", "newer than tested", "not installed")


def _major_minor(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _installed(package: str) -> str | None:
    names = TRITON_DISTRIBUTIONS if package == "triton" else (package,)
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def judge(package: str, version: str | None, oldest: tuple[int, int], newest: tuple[int, int],
          extra: str | None = None) -> Found:
    """One package's verdict against its supported range."""
    span = f"{oldest[0]}.{oldest[1]} to {newest[0]}.{newest[1]}"
    if version is None:
        if extra is None:
            return Found(package, None, "not supported", f"required; install the project ({span})")
        return Found(package, None, "not installed", f"optional: pip install 'rope-harness[{extra}]' ({span})")
    found = _major_minor(version)
    if found is None:
        return Found(package, version, "unknown version", f"cannot read the version; supported {span}")
    if found < oldest:
        return Found(package, version, "not supported", f"older than {oldest[0]}.{oldest[1]}; supported {span}")
    if found > newest:
        return Found(package, version, "newer than tested", f"tested {span}")
    return Found(package, version, "supported", f"tested {span}")


def stack() -> list[Found]:
    """Python and each package of ``SUPPORTED`` as installed here, with its verdict."""
    found = [judge("python", platform.python_version(), *PYTHON)]
    for package, (oldest, newest, extra) in SUPPORTED.items():
        found.append(judge(package, _installed(package), oldest, newest, extra))
    return found


def describe(found: list[Found]) -> list[str]:
    """Lines for ``rope-harness devices``: one per package, then the overall verdict."""
    width = max(len(f.package) for f in found)
    lines = [f"  {f.package:<{width}}  {f.version or '-':<14} {f.verdict} ({f.note})" for f in found]
    bad = [f.package for f in found if not f.ok]
    lines.append("stack: supported" if not bad else f"stack: NOT supported ({', '.join(bad)})")
    return lines
