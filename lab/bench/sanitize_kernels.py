"""Run the Triton kernels on plain (unguarded) GPU tensors under compute-sanitizer memcheck.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \\
        python -m lab.bench.sanitize_kernels [--mutant NAME]

Without the caching allocator every tensor is its own allocation, so a read past the cos/sin
cache's last row (positions at max_position - 1) leaves the allocation and memcheck reports it.

The launches are the suite's own fixed cases, run through pytest with the ``explicit`` profile (the
@example cases only, no search): every known-bug trigger of the rotation and the fixed ragged steps
of the position step.  With --mutant, the named kernel mutant of properties/mutants/kernel.py runs
instead of the kernel (``--rope-impl properties.mutants.kernel:NAME``).
"""

import argparse
import subprocess
import sys

POSITION_STEP_MUTANTS = ("positions_store_unmasked",)   # the others mutate the rotation kernel

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--mutant", default=None, help="a kernel mutant of properties/mutants/kernel.py")
args = parser.parse_args()

common = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-profile=explicit",
          "--rope-device", "cuda"]
runs = []
if args.mutant not in POSITION_STEP_MUTANTS:
    impl = f"properties.mutants.kernel:{args.mutant}" if args.mutant else "triton"
    runs.append(common + ["--pyargs", "properties.rotation.test_rotation", "-k", "test_known_bug_triggers_match_reference",
                          "--rope-impl", impl])
if args.mutant is None or args.mutant in POSITION_STEP_MUTANTS:
    impl = f"properties.mutants.kernel:{args.mutant}" if args.mutant else "triton"
    runs.append(common + ["--pyargs", "properties.position_step.test_runner_positions", "-k",
                          "test_prepared_positions_match_reference", "--rope-position-step-impl", impl])
status = 0
for cmd in runs:
    print("sanitize_kernels:", " ".join(cmd[1:]), flush=True)
    status = max(status, subprocess.call(cmd))
print(f"sanitize_kernels: {len(runs)} pytest runs of {args.mutant or 'the correct kernels'} done (exit {status})")
sys.exit(status)
