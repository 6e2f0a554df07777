"""The position step's slice: the checking machinery of the model runner's position step (the kernel
that turns the scheduler's step into M-RoPE / XD-RoPE positions), one module per part, as every
checked thing's slice has them:

* cases: the case, one runner step over persistent request slots, and its tensors;
* check: the call (positionally, ``out`` last), the comparison with ``reference.prepare_positions``
  (the bound is equality), the failure;
* batch: the check of many steps, called back to back and waited for once, a verdict per step;
* diagnosis: what differs, and the cause a failure is grouped under;
* guards: the step inside guard regions and the interpreter's memory tracer;
* case_file: its kind of case file (a failing plain check writes one); replay: its replay;
* modes: steps on one set of buffers refilled in place, eagerly or replayed in a CUDA graph.

The contract and the implementation records are rope.registry's (``get_positions_implementation``);
the properties an implementation must pass are properties/position_step/.  A failure under guards
prints the whole step and writes no case file (its replay would run the plain check, which a write
only the guards see passes).  A slice imports the shared machinery of rope.harness, never another
slice (pyproject's import-linter contracts).
"""

# Its modules: each is imported by its own name.
__all__ = ["batch", "case_file", "cases", "check", "diagnosis", "guards", "modes", "replay"]
