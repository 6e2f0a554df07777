"""The mutants: the :class:`Mutant` record, the kinds, the catalogue read from the suite, and the
selection by ``--only``.

The suite describes its own mutants (properties/mutants/catalogue.py); the harness reads that
description by running ``python -m properties.mutants`` as a subprocess in the suite's root, so
``rope/`` never imports ``properties``, and an installed wheel works in any directory.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass

from rope.harness.suite import SUITE_PACKAGE, suite_dir

CATALOGUE_MODULE = f"{SUITE_PACKAGE}.mutants"
CATALOGUE_SCHEMA = "rope-harness/mutant-catalogue/1"
KINDS = ("rotation", "rotation-kernel", "rotation-backward", "positions", "positions-kernel", "position-ids", "table",
         "fused", "dispatch")
# rotation-backward: a right forward with a broken backward (only the backward property shows it).
ROTATION_KINDS = ("rotation", "rotation-kernel", "rotation-backward")
POSITION_KINDS = ("positions", "positions-kernel")


class CatalogueError(RuntimeError):
    """The suite's catalogue could not be read (the subprocess failed, or its output is not one)."""


@dataclass(frozen=True)
class Mutant:
    """One mutant: ``name`` is ``<module>:<attribute>`` (unique: neox_for_gptj exists as a
    wrapper and as a kernel mutant), ``target`` the import path the registry resolves."""
    name: str
    kind: str
    target: str
    parent: str | None              # the unmutated implementation a failure is confirmed against
    doc: str = ""
    memory_safety: bool = False
    needs: str | None = None        # "gpu-deep": only a GPU in the deep profile shows the bug

    @property
    def attribute(self) -> str:
        return self.name.split(":", 1)[1]

    @classmethod
    def from_dict(cls, d: dict) -> "Mutant":
        if d.get("kind") not in KINDS:
            raise CatalogueError(f"mutant {d.get('name')!r}: kind={d.get('kind')!r}, must be one of {KINDS}")
        try:
            return cls(str(d["name"]), d["kind"], str(d["target"]), d["parent"], str(d.get("doc") or ""),
                       bool(d.get("memory_safety", False)), d.get("needs"))
        except KeyError as exc:
            raise CatalogueError(f"catalogue entry without {exc}: {d}") from None


def parse_catalogue(text: str) -> list[Mutant]:
    """The mutants of ``python -m properties.mutants``'s JSON output, validated."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CatalogueError(f"the catalogue is not JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(data, dict) or data.get("schema") != CATALOGUE_SCHEMA:
        raise CatalogueError(f"catalogue schema {data.get('schema') if isinstance(data, dict) else None!r}, "
                             f"expected {CATALOGUE_SCHEMA!r}")
    mutants = [Mutant.from_dict(d) for d in data.get("mutants", [])]
    names = [m.name for m in mutants]
    if len(set(names)) != len(names):
        raise CatalogueError(f"duplicate mutant names: {sorted(n for n in set(names) if names.count(n) > 1)}")
    return mutants


@functools.lru_cache(maxsize=None)
def _load(python: str, root: str) -> tuple[Mutant, ...]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run([python, "-m", CATALOGUE_MODULE], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        raise CatalogueError(f"python -m {CATALOGUE_MODULE} exited with {proc.returncode}:\n{tail}")
    return tuple(parse_catalogue(proc.stdout))


def discover_mutants() -> list[Mutant]:
    """Every mutant defined in properties/mutants, in catalogue order (one subprocess per process:
    the answer is cached)."""
    return list(_load(sys.executable, str(suite_dir().parent)))


def select_mutants(mutants: list[Mutant], only: list[str]) -> list[Mutant]:
    """Filter by ``--only`` values: a full name (``kernel:neox_for_gptj``), a bare attribute name
    (``neox_for_gptj``: every mutant of that name) or an import path.  Unknown names raise ValueError."""
    if not only:
        return list(mutants)
    keep = []
    for want in only:
        hits = [m for m in mutants if want in (m.name, m.attribute, m.target)]
        if not hits:
            raise ValueError(f"--only={want!r}: no such mutant (known: {', '.join(m.name for m in mutants)})")
        keep += [m for m in hits if m not in keep]
    return [m for m in mutants if m in keep]


NEEDS = {"gpu-deep": "a GPU (its bug shows only past 2^31 elements of q or of the cos/sin cache: "
                     "test_prefill.py's huge cases, deep profile)",
         "gpu": "a GPU (its bug shows only in a CUDA/HIP graph replayed with new inputs: test_modes.py)"}


def unmet_need(m: Mutant) -> str | None:
    """Why ``m`` cannot run here (None: it can)."""
    if m.needs is None:
        return None
    if m.needs not in NEEDS:
        return f"needs {m.needs!r}, which this runner does not know"
    from rope.devices import available_devices
    if m.needs in ("gpu", "gpu-deep") and not {"cuda", "rocm"} & set(available_devices()):
        return f"needs {NEEDS[m.needs]}"
    return None


def kind_label(m: Mutant) -> str:
    """The kind as the table shows it."""
    if m.kind == "dispatch":
        return "dispatch (dedicated test)"
    return m.kind + (" (memory)" if m.memory_safety else "")
