"""The position ids' slice: the checking machinery of what a model computes from a prompt (its
``get_rope_index``), one module per part, as every checked thing's slice has them:

* implementations: the adapters by name, and what an implementation declares (its families, why a
  prompt is unsupported);
* cases: the case, a batch of prompt descriptions, and its record form;
* check: the call, the validation of what it returned, the comparison with the expected ids (the
  float64 reference is ``reference.prompt_positions``; the bound is equality);
* batch: the same check as a verdict per prompt (a case is a batch of prompts already);
* diagnosis: the rules naming how the ids depart;
* case_file: its kind of case file; replay: its replay.

The properties an implementation must pass are properties/position_ids/.  A slice imports the shared
machinery of rope.harness, never another slice (pyproject's import-linter contracts).
"""

# Its modules: each is imported by its own name.
__all__ = ["batch", "case_file", "cases", "check", "diagnosis", "implementations", "replay"]
