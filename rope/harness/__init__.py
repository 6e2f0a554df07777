"""The checking machinery: the case model and its inputs (inputs), the comparison with the
reference and its tolerance (comparison, tolerance), the diagnosis of a mismatch (diagnosis), case
files and their replay (case_files, repro), the run report (report), GPU placement and sharding
(placement, sharding), campaigns (campaign), the benchmark (bench), the mutation runner (mutation),
the command line (cli) and the pytest plugin (plugin).

It imports the kernels' contract (rope.spec, rope.registry, ...) and the reference; nothing below
it imports it, and it never imports the test suite (``properties``), which it runs through pytest.
"""

# Its modules and packages: nothing is handed on from here (each is imported by its own name).
__all__ = ["atomic", "bench", "bench_contenders", "campaign", "case_files", "causes", "cli", "comparison",
           "compile_lock", "deadline", "diagnosis", "inputs", "interpreter", "mutation", "output_dir", "ownership",
           "placement", "plugin", "position_ids", "profiling", "report", "repro", "sharding", "shared_db", "stack",
           "stop", "suite", "table_store", "tolerance"]

from rope.harness.ownership import check_own_packages

check_own_packages()   # before anything mixes our rope with another distribution's (rope.harness.ownership)
