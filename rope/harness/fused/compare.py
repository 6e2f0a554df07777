"""The element-wise comparisons the fused ops' check and diagnosis share: elements past a bound,
storage bits, the cache rows a call writes or must keep."""

from __future__ import annotations

import torch

__all__ = ["bad_elements", "bits", "changed_rows", "kept_rows", "mismatches", "rows_mask"]


def bad_elements(got: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """bool, got's shape: the elements past ``bound`` (NaN matches NaN; any other NaN is infinite)."""
    got = got.detach().cpu().to(torch.float64)
    expected = expected.detach().cpu().to(torch.float64)
    err = torch.where(torch.isnan(got) & torch.isnan(expected), 0.0, (got - expected).abs())
    err = torch.where(torch.isnan(err), float("inf"), err)
    return err > bound.cpu()


def mismatches(name: str, got: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> list[str]:
    """The problems of ``got`` against ``expected`` within ``bound`` (all float64-comparable): empty
    when every element is within; else the count and the worst element, index included."""
    bad = bad_elements(got, expected, bound)
    if not bool(bad.any()):
        return []
    got = got.detach().cpu().to(torch.float64)
    expected = expected.detach().cpu().to(torch.float64)
    err = torch.where(torch.isnan(got) & torch.isnan(expected), 0.0, (got - expected).abs())
    err = torch.where(torch.isnan(err), float("inf"), err)
    ratio = torch.where(bound.cpu() > 0, err / bound.cpu(), float("inf"))
    worst = int(torch.argmax(torch.where(bad, ratio, -1.0)))
    index, rest = [], worst
    for size in reversed(got.shape):
        rest, i = divmod(rest, size)
        index.insert(0, i)
    return [f"{name}: {int(bad.sum())} of {got.numel()} elements past the bound; worst at {tuple(index)}: got "
            f"{float(got.flatten()[worst]):.9g}, expected {float(expected.flatten()[worst]):.9g}, bound "
            f"{float(bound.cpu().flatten()[worst]):.3g}"]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The storage bits of ``t`` as an integer tensor of its shape (NaN payloads and -0 compared too)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def rows_mask(written: torch.Tensor, cache: torch.Tensor, layout: str) -> torch.Tensor:
    """bool, the cache's shape: the elements of the rows ``written`` [num_blocks, block_size] marks."""
    if cache.dim() == 3:                                    # MLA latent cache [blocks, block_size, width]
        return written[:, :, None].expand(cache.shape)
    if layout == "HND":
        return written[:, None, :, None].expand(cache.shape)
    return written[:, :, None, None].expand(cache.shape)


def changed_rows(before: torch.Tensor, after: torch.Tensor, layout: str) -> torch.Tensor:
    """bool [num_blocks, block_size]: the rows whose bits changed."""
    diff = bits(before.cpu()) != bits(after.cpu())
    if diff.dim() == 3:
        return diff.any(dim=2)
    return diff.any(dim=(1, 3)) if layout == "HND" else diff.any(dim=(2, 3))


def kept_rows(name: str, before: torch.Tensor, after: torch.Tensor, written: torch.Tensor, layout: str) -> list[str]:
    """Every row the call does not write keeps its bits (stale contents survive)."""
    keep = ~rows_mask(written.cpu(), before, layout)
    changed = (bits(before.cpu()) != bits(after.cpu())) & keep
    if bool(changed.any()):
        first = tuple(int(i) for i in changed.nonzero()[0])
        return [f"{name}: {int(changed.sum())} elements of rows no slot names changed (first at {first})"]
    return []
