"""The cos/sin table's slice: the checking machinery of ``fn(spec, max_position, dtype, device) ->
cos_sin_cache`` (docs/spec.md §1.2), one module per part, as every checked thing's slice has them:

* cases: the case (a spec, the rows asked for, the dtype, the seed of the rows compared);
* bound: the per-element bound, derived from the float32 recipe and the cast;
* check: the call, the validation of what it returned, the comparison with the float64 reference
  (reference.cos_sin_table) and the tagged assertion;
* batch: the check of many tables, built back to back and waited for once, a verdict per case;
* diagnosis: the rules naming how the table departs;
* case_file: its kind of case file; replay: its replay.

The implementations are the registry's (rope.registry.get_table_implementation).  The properties
an implementation must pass are properties/table/.  A slice imports the shared machinery of
rope.harness, never another slice (pyproject's import-linter contracts).
"""

# Its modules: each is imported by its own name.
__all__ = ["batch", "bound", "case_file", "cases", "check", "diagnosis", "replay"]
