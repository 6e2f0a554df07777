"""The checking machinery, one slice per checked thing and the machinery they share.

The slices (each the same rooms: cases, check, diagnosis, case_file, replay, guards where it has
them; never importing one another): rotation (the rotation given a table; its bound, its dispatch
and baseline checks), position_step (the runner's position step) and position_ids (a model's
position ids).  Shared below them: the case-file envelope (case_files), the draws and the example
running now (draws), the guard primitives and the interpreter's tracer (guards), the table store,
the causes, the run report, placement and sharding, deadlines and the stop.  Above them: the replay
of a case file by its kind (repro), campaigns (campaign), the benchmark (bench), the mutation runner
(mutation), the command line (cli) and the pytest plugin (plugin).

It imports the kernels' contract (rope.spec, rope.registry, ...) and the reference; nothing below
it imports it, and it never imports the test suite (``properties``), which it runs through pytest.
"""

# Its modules and packages: nothing is handed on from here (each is imported by its own name).
__all__ = ["atomic", "bench", "bench_contenders", "campaign", "case_files", "causes", "cli", "compile_lock",
           "deadline", "draws", "guards", "interpreter", "mutation", "output_dir", "ownership", "placement", "plugin",
           "position_ids", "position_step", "profiling", "report", "repro", "rotation", "sharding", "shared_db",
           "stack", "stop", "suite", "table_store"]

from rope.harness.ownership import check_own_packages

check_own_packages()   # before anything mixes our rope with another distribution's (rope.harness.ownership)
