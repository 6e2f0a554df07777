"""The rotation's slice: the checking machinery of a rotation implementation (given a cos/sin table),
one module per part, as every checked thing's slice has them:

* cases: the case (spec, head counts, tokens, dtype, positions, layout, seed) and the tensors it
  regenerates, bit for bit, on any device;
* check: the call, the comparison with the float64 reference (``reference.rotate``), the report of a
  mismatch; bound: the per-element bound it is held to (docs/tolerance.md);
* batch: the check of many cases at once without pytest (one reference and one bound over the
  batch on the implementation's device), a verdict per case;
* diagnosis: the rules naming what a mismatch most likely is;
* backward: the backward of an implementation that declares autograd, held to the reference VJP
  (a verdict per case, and its labels: gradient_missing, upstream_gradient_written, gradient_wrong);
* modes: the implementation called as engines call it (under torch.compile, replayed in a CUDA graph);
* case_file: its kind of case file; replay: its replay;
* guards: the case inside guard regions and the interpreter's memory tracer;
* dispatch: the check of the platform dispatch of the built-in rotation ops; baseline: the serving
  engines' own style of test, kept as a baseline for the mutation runner.

The contract and the implementation records are rope.registry's (``get_implementation``); the
properties an implementation must pass are properties/rotation/ (and properties/dispatch/).  A slice
imports the shared machinery of rope.harness, never another slice (pyproject's import-linter contracts).
"""

# Its modules and packages: each is imported by its own name.
__all__ = ["backward", "baseline", "batch", "bound", "case_file", "cases", "check", "diagnosis", "dispatch", "guards",
           "modes", "replay"]
