"""Run the Triton kernels on plain (unguarded) GPU tensors for compute-sanitizer memcheck.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
        python3 tools/sanitize_kernels.py [--mutant NAME]

Without the caching allocator every tensor is its own allocation, so a read past the cos/sin
cache's last row (positions at max_position - 1) leaves the allocation and memcheck reports it.
With --mutant, the named kernel mutant from properties/mutants/kernel.py runs instead.
"""

import argparse
import sys

import rope  # noqa: F401
from rope.harness.comparison import run_rotation
from properties.known_cases import KNOWN_BUG_CASES
from properties.strategies import RaggedBatch
from properties.test_runner_positions import CHUNK_1, CHUNK_2, DECODE, run_positions
from rope.registry import get_implementation, get_positions_implementation

parser = argparse.ArgumentParser()
parser.add_argument("--mutant", default=None)
args = parser.parse_args()
if args.mutant:
    from properties.mutants import kernel
    fn = getattr(kernel, args.mutant)
    rotation = fn if args.mutant in kernel.ROTARY_MUTANTS else None
    positions = fn if args.mutant in kernel.POSITIONS_MUTANTS else None
else:
    rotation, positions = get_implementation("triton"), get_positions_implementation("triton")
ran = 0
if rotation is not None:
    for name, case in KNOWN_BUG_CASES.items():
        run_rotation(rotation, case, "cuda")
        ran += 1
if positions is not None:
    for batch in (CHUNK_1, CHUNK_2, DECODE):
        run_positions(positions, batch, "cuda")
        ran += 1
print(f"sanitize_kernels: {ran} launches of {args.mutant or 'the correct kernels'} completed")
sys.exit(0)
