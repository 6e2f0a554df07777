"""The host's own Python per call of the rotation entries, the kernel stubbed out: what a launch
costs before Triton's launcher (docs/launch-defaults.md, "The host path").  Qwen2.5-VL-72B's shapes
(64 query heads, 8 key heads), bf16, 1 and 4096 tokens, 20,000 calls of the unchecked launch and
5,000 of the public entry.  On a GPU box the positions' values are not checked (no host sync);
ROPE_CHECK_VALUES=0 does the same on the CPU.

    TRITON_INTERPRET=1 ROPE_CHECK_VALUES=0 python -m lab.bench.host_path
"""
import time

import torch

import rope.triton.rotary as rotary
from rope import RopeSpec, cos_sin_cache


class _StubKernel:
    """Takes the grid and the arguments, launches nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def per_call_us(fn, calls: int) -> float:
    for _ in range(min(200, calls)):
        fn()
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return 1e6 * (time.perf_counter() - started) / calls


def main() -> None:
    rotary._rotary_kernel = _StubKernel()
    spec = RopeSpec(head_size=128, rotary_dim=128, is_neox_style=True, sections=(16, 24, 24), max_position=4096)
    cache = cos_sin_cache(spec, dtype=torch.bfloat16)
    for tokens in (1, 4096):
        positions = torch.randint(0, 4096, (3, tokens))
        q = torch.randn(tokens, 64 * 128, dtype=torch.bfloat16)
        k = torch.randn(tokens, 8 * 128, dtype=torch.bfloat16)
        unchecked = per_call_us(lambda: rotary.launch_rotary(spec, positions, q, k, cache), 20000)
        public = per_call_us(lambda: rotary.rotate_triton(spec, positions, q, k, cache), 5000)
        print(f"{tokens:5d} tokens: launch_rotary {unchecked:5.1f} us/call, rotate_triton {public:5.1f} us/call")


if __name__ == "__main__":
    main()
