"""The mutant catalogue: every mutant of this package, as data the harness can read without
importing the suite (``rope/`` never imports ``properties``).

``python -m properties.mutants`` prints it as JSON (rope.harness.mutation.catalogue runs that as a
subprocess); :func:`catalogue` returns the same list of dicts, in catalogue order:

    name           ``<module>:<attribute>``, unique (neox_for_gptj is a wrapper and a kernel mutant)
    kind           rotation | rotation-kernel | rotation-backward | positions | positions-kernel | position-ids |
                   table | fused | dispatch
    target         the import path the registry resolves (``--rope-impl`` / ``--rope-position-step-impl``)
    parent         the unmutated implementation a failure is confirmed against (None: dispatch)
    doc            the first paragraph of the mutant's docstring, on one line
    memory_safety  whether only the guards / tracer of rope/harness/guards.py see the bug
    needs          null, or "gpu-deep": only a GPU in the deep profile shows the bug (q past 2^31
                   elements); the mutation runner lists it as not run where no GPU is found
"""

from __future__ import annotations

import contextlib
import json
import sys

SCHEMA = "rope-harness/mutant-catalogue/1"

# Kernel mutants whose bug is a memory-safety one: the output is right (or right on plain,
# contiguous inputs), and only the guarded inputs / interpreter tracer of rope/harness/guards.py see
# it.  The same split as kernel.py's ROTARY_CELLS (detectors without "plain";
# test_mutation_runner.py holds the two together) plus the positions kernel's unmasked store.
MEMORY_SAFETY = frozenset({"cos_sin_unmasked", "cos_sin_unmasked_head_padded", "positions_rows_packed",
                           "positions_store_unmasked"})

PACKAGE = __name__.rsplit(".", 1)[0]          # properties.mutants


def _first_line(doc: str | None) -> str:
    """The docstring's first paragraph, on one line."""
    return " ".join((doc or "").strip().split("\n\n", 1)[0].split())


def _entry(module: str, name: str, kind: str, attribute: str, parent: str | None, doc: str | None,
           memory_safety: bool = False, needs: str | None = None) -> dict:
    return {"name": f"{module}:{name}", "kind": kind, "target": f"{PACKAGE}.{module}:{attribute}",
            "parent": parent, "doc": _first_line(doc), "memory_safety": memory_safety, "needs": needs}


def catalogue() -> list[dict]:
    """Every mutant defined in properties/mutants, in catalogue order."""
    from properties.mutants.broken_position_ids import BROKEN_POSITION_IDS
    from properties.mutants.broken_positions import BROKEN_POSITIONS, STEP_MODE_MUTANTS
    from properties.mutants.broken_tables import BROKEN_TABLES
    from properties.mutants.broken_rotations import BROKEN_ROTATIONS, GPU_ROTATION_MUTANTS
    from properties.mutants.dispatch import BROKEN_OPS
    from properties.mutants.kernel import GPU_DEEP_MUTANTS, POSITIONS_MUTANTS, ROTARY_MUTANTS
    from rope.harness.mutation.kernel_mutant import SubstitutionError

    correct_loop = f"{PACKAGE}.broken_positions:correct_loop"
    out = [_entry("broken_rotations", name, "rotation", name, "native", fn.__doc__)
           for name, fn in BROKEN_ROTATIONS.items()]
    out += [_entry("broken_rotations", name, "rotation", name, "native", fn.__doc__, needs="gpu")
            for name, fn in GPU_ROTATION_MUTANTS.items()]
    # Right forwards, broken backwards: their parent is the differentiable Triton entry.
    from properties.mutants.broken_backwards import BROKEN_BACKWARDS
    out += [_entry("broken_backwards", name, "rotation-backward", name, "triton-autograd", fn.__doc__)
            for name, fn in BROKEN_BACKWARDS.items()]
    out += [_entry("kernel", name, "rotation-kernel", name, "triton", m.__doc__, name in MEMORY_SAFETY)
            for name, m in ROTARY_MUTANTS.items()]
    out += [_entry("kernel", name, "rotation-kernel", name, "triton", m.__doc__, needs="gpu-deep")
            for name, m in GPU_DEEP_MUTANTS.items()]
    out += [_entry("broken_positions", name, "positions", name, correct_loop, fn.__doc__)
            for name, fn in BROKEN_POSITIONS.items()]
    # Right on fresh buffers, stale on refilled ones: the Triton entry underneath is their parent.
    out += [_entry("broken_positions", name, "positions", name, "triton", fn.__doc__)
            for name, fn in STEP_MODE_MUTANTS.items()]
    out += [_entry("kernel", name, "positions-kernel", name, "triton", m.__doc__, name in MEMORY_SAFETY)
            for name, m in POSITIONS_MUTANTS.items()]
    reference_ids = f"{PACKAGE}.broken_position_ids:reference_ids"
    out += [_entry("broken_position_ids", name, "position-ids", name, reference_ids, fn.__doc__)
            for name, fn in BROKEN_POSITION_IDS.items()]
    out += [_entry("broken_tables", name, "table", name, "ours", fn.__doc__) for name, fn in BROKEN_TABLES.items()]
    from properties.mutants.broken_fused import BROKEN_FUSED
    out += [_entry("broken_fused", name, "fused", name, "triton", fn.__doc__) for name, fn in BROKEN_FUSED.items()]
    # Dispatch mutants are op classes: the target names the class, the catalogue name the entry.
    out += [_entry("dispatch", name, "dispatch", cls.__name__, None, cls.__doc__)
            for name, (_, cls) in BROKEN_OPS.items()]
    # A kernel mutant is a patch of the kernel's source: one that no longer applies (the kernel was
    # edited under it) would raise where the bug should be, and a raise fails the suite's tests like
    # a catch.  The catalogue refuses it, so the runner never counts it as caught.
    stale = []
    for m in [*ROTARY_MUTANTS.values(), *GPU_DEEP_MUTANTS.values(), *POSITIONS_MUTANTS.values()]:
        try:
            m.source()
        except SubstitutionError as exc:
            stale.append(str(exc))
    if stale:
        raise SubstitutionError("kernel mutants that no longer apply to the kernel's source (update their "
                                "substitutions to the bug's new place):\n" + "\n".join(stale))
    return out


def main() -> int:
    """Print ``{"schema": ..., "mutants": [...]}`` on stdout, nothing else (anything the imports
    print goes to stderr)."""
    with contextlib.redirect_stdout(sys.stderr):
        mutants = catalogue()
    sys.stdout.write(json.dumps({"schema": SCHEMA, "mutants": mutants}) + "\n")
    sys.stdout.flush()
    return 0
