"""What an in-place read-modify-write stream reaches on this GPU, next to the copy bandwidth.

The rotation kernel updates q and k in place (the serving engines' contract).  The copy ceiling
(rope.bench.copy_bandwidth) reads one buffer and writes another; this measures the same bytes
moved in place: torch's ``mul_`` and a plain Triton in-place scale over a buffer the size of
Qwen2.5-VL-72B's q+k at 65536 tokens (2.4 GB bf16), timed like the benchmark (do_bench, L2
cleared per call).  Notes: docs/perf-notes.md section 5.

    PYTHONPATH=. python3 tools/inplace_ceiling.py
"""
import torch
import triton
import triton.language as tl
import triton.testing as tt

from rope import bench


@triton.jit
def _scale_inplace(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(x_ptr + offs, (x * 1.0000001).to(x_ptr.dtype.element_ty), mask=mask)


def main():
    dev = "cuda"
    copy = bench.copy_bandwidth(dev)
    print(f"copy (read one buffer, write another): {copy:.0f} GB/s")
    for tokens in (4096, 65536):
        n = tokens * (64 + 8) * 128                      # Qwen2.5-VL-72B q + k elements
        x = torch.randn(n, device=dev, dtype=torch.bfloat16)
        nbytes = 2 * n * 2                               # read + write
        ms = tt.do_bench(lambda: x.mul_(1.0000001), warmup=10, rep=100, return_mode="median")
        print(f"{tokens} tokens, torch mul_ in place: {ms * 1e3:.1f} us, {nbytes / ms / 1e6:.0f} GB/s, "
              f"{100 * nbytes / ms / 1e6 / copy:.1f}% of copy")
        for block, warps in ((1024, 4), (2048, 4), (4096, 8), (8192, 8)):
            fn = lambda: _scale_inplace[(triton.cdiv(n, block),)](x, n, BLOCK=block, num_warps=warps)
            ms = tt.do_bench(fn, warmup=10, rep=100, return_mode="median")
            print(f"{tokens} tokens, Triton in-place scale block={block} warps={warps}: {ms * 1e3:.1f} us, "
                  f"{nbytes / ms / 1e6:.0f} GB/s, {100 * nbytes / ms / 1e6 / copy:.1f}% of copy")


if __name__ == "__main__":
    main()
