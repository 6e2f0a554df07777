"""What an in-place read-modify-write stream reaches on this GPU, next to the copy bandwidth.

The rotation kernel updates q and k in place (the serving engines' contract).  The copy ceiling
(rope.harness.bench.copy_bandwidth) reads one buffer and writes another; this measures the same bytes
moved in place: torch's ``mul_`` and a plain Triton in-place scale over a buffer the size of
Qwen2.5-VL-72B's q+k at 4096 and 65536 tokens, timed like the benchmark (input rotation,
rope.harness.bench._timer) and, for comparison, with do_bench (L2 flushed by a memset before each call).
Also the partial-rotary pattern (GLM-4.1V: the first 64 of each 128-channel head), the ceiling
for a kernel that must skip the pass-through channels.  Notes: lab/perf-notes.md sections 5 and 6.

    python -m lab.bench.inplace_ceiling
"""
import torch
import triton
import triton.language as tl
import triton.testing as tt

from rope.harness import bench


@triton.jit
def _scale_inplace(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(x_ptr + offs, (x * 1.0000001).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _scale_row_prefix_inplace(x_ptr, rows, ROW: tl.constexpr, PREFIX: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    # The partial-rotary pattern: the first PREFIX of every ROW elements (GLM-4.1V: 64 of each
    # 128-channel head), BLOCK_ROWS head rows per program.
    r = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    offs = r[:, None] * ROW + tl.arange(0, PREFIX)[None, :]
    mask = (r < rows)[:, None]
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(x_ptr + offs, (x * 1.0000001).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def scale_qk_row_prefix_inplace(q_ptr, k_ptr, q_rows, k_rows, ROW: tl.constexpr, PREFIX: tl.constexpr,
                                 BLOCK_ROWS: tl.constexpr):
    # The same pattern over q and k in one launch, as a rotation kernel launches: programs
    # [0, cdiv(q_rows, BLOCK_ROWS)) take q's head rows, the rest k's.
    q_blocks = tl.cdiv(q_rows, BLOCK_ROWS)
    is_k = tl.program_id(0) >= q_blocks
    x_ptr = tl.where(is_k, k_ptr, q_ptr)
    rows = tl.where(is_k, k_rows, q_rows)
    block = tl.program_id(0) - tl.where(is_k, q_blocks, 0)
    r = block.to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    offs = r[:, None] * ROW + tl.arange(0, PREFIX)[None, :]
    mask = (r < rows)[:, None]
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(x_ptr + offs, (x * 1.0000001).to(x_ptr.dtype.element_ty), mask=mask)


def partial_rows(copy, timer):
    """GLM-4.1V-9B's bytes: the first 64 channels of each 128-channel head of q (32 heads) and
    k (2 heads), in place: what a partial-rotary kernel can reach (its floor counts only these)."""
    for tokens in (4096, 65536):
        rows = tokens * (32 + 2)
        nbytes = 2 * rows * 64 * 2
        xs = [torch.randn(rows * 128, device="cuda", dtype=torch.bfloat16)
              for _ in range(bench.input_sets("cuda", nbytes, tokens))]
        for block_rows, warps in ((16, 4), (32, 4), (64, 8)):
            fns = [lambda x=x: _scale_row_prefix_inplace[(triton.cdiv(rows, block_rows),)](
                x, rows, ROW=128, PREFIX=64, BLOCK_ROWS=block_rows, num_warps=warps) for x in xs]
            ms, _ = timer(fns, tokens)
            print(f"{tokens} tokens, GLM-4.1V partial rows (64 of 128 channels) in place, {block_rows} rows x "
                  f"{warps} warps: {ms * 1e3:.1f} us = {100 * nbytes / ms / 1e6 / copy:.1f}% of copy "
                  f"(rotating {len(fns)} buffers)")


def main():
    dev = "cuda"
    copy = bench.copy_bandwidth(dev)
    timer = bench._timer(dev)
    print(f"copy (read one buffer, write another): {copy:.0f} GB/s")
    for tokens in (4096, 65536):
        n = tokens * (64 + 8) * 128                      # Qwen2.5-VL-72B q + k elements
        nbytes = 2 * n * 2                               # read + write
        xs = [torch.randn(n, device=dev, dtype=torch.bfloat16) for _ in range(bench.input_sets(dev, nbytes, tokens))]

        def report(what, fns):
            ms, _ = timer(fns, tokens)
            flushed = tt.do_bench(fns[0], warmup=10, rep=100, return_mode="median")
            print(f"{tokens} tokens, {what}: {ms * 1e3:.1f} us = {100 * nbytes / ms / 1e6 / copy:.1f}% of copy "
                  f"(rotating {len(fns)} buffers); under do_bench {flushed * 1e3:.1f} us = "
                  f"{100 * nbytes / flushed / 1e6 / copy:.1f}%")
        report("torch mul_ in place", [lambda x=x: x.mul_(1.0000001) for x in xs])
        for block, warps in ((1024, 4), (4096, 8)):
            report(f"Triton in-place scale block={block} warps={warps}",
                   [lambda x=x: _scale_inplace[(triton.cdiv(n, block),)](x, n, BLOCK=block, num_warps=warps)
                    for x in xs])


if __name__ == "__main__":
    main()
    partial_rows(bench.copy_bandwidth("cuda"), bench._timer("cuda"))
