"""Sweeps, ceilings and probes of the kernels and of the harness's own speed, run from the
repository root as ``python -m lab.bench.NAME`` (each module's docstring gives its command line).
Shared helpers are plain modules of this package: latency_floor.chain_ms (a chain of launches timed
on one stream), layout_limits.LAYOUTS (the measured models' layouts), inplace_ceiling's stream kernel."""
