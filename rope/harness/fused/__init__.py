"""The fused ops' slice (docs/spec.md §10): the checking machinery of QK-norm + RoPE on a packed qkv
(contract A), RoPE + KV-cache write (contract B) and MLA's RoPE + latent-cache write (contract C),
one module per part, as every checked thing's slice has them:

* cases: the cases (:class:`~rope.harness.fused.cases.QKNormCase`,
  :class:`~rope.harness.fused.cases.CacheCase`, :class:`~rope.harness.fused.cases.MLACase`), rebuilt
  into tensors bit for bit from their seeds;
* bound: the per-element bounds (the norm's rounding carried through the rotation; the FP8 store);
* compare: the element-wise comparisons (bounds, bits, rows kept);
* check: the call under the call deadline, the comparison with the float64 reference
  (reference.fused), the assertion tagged with its cause, the check in the run report;
* batch: the check of many cases of one op, called back to back and waited for once, a verdict per case;
* diagnosis: the rules naming how a fused op departs;
* case_file: the fused kind of case file (the op, its case, the diagnosis), every field validated;
* replay: a case file run again (``rope-harness repro``, ``pytest --rope-repro``).

The properties an implementation must pass are properties/fused/.  A slice imports the shared
machinery of rope.harness, never another slice; the fused ops' q and k are a rotation, held to the
rotation slice's bound (rope.harness.rotation.bound) and drawn at its position kinds: the two imports
pyproject's contracts allow by name.
"""

# Its modules: each is imported by its own name.
__all__ = ["batch", "bound", "case_file", "cases", "check", "compare", "diagnosis", "replay"]
