"""The lab: what the project measures about its own kernels and carries to an offline GPU box. Not
shipped, and nothing shipped imports it (import-linter): bench/ (sweeps, ceilings, probes, the
harness's own speed; run from the repository root as ``python -m lab.bench.NAME``), offline/ (the
kit that carries vLLM, SGLang and FlashInfer to a box without network), perf-notes.md (the kernel's
change log with what each change predicted and measured) and runs/ (raw logs of GPU runs)."""
