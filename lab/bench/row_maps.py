"""The frequency-to-row maps on the GPU, in one run: every named map (and a custom one) against the
chunked map of the same heads, as a fraction of the copy bandwidth, and the chunked and interleaved
maps against the kernel of a baseline commit (the kernel before the map table), to show they lost
nothing.

    python -m lab.bench.row_maps [--baseline REV] [--tokens 1 64 4096 16384]

The baseline kernel is ``git show REV:rope/triton/rotary.py`` loaded beside the current one; both
are launched unchecked (``launch_rotary``), timed like the benchmark (rope.harness.bench: CUDA graphs
up to its graph size, else back-to-back calls rotating through input sets larger than the L2),
alternating A B A B so that drift hits both.  Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from rope.cache import cos_sin_cache
from rope.harness import bench
from rope.spec import RopeSpec
from rope.triton import rotary

HEADS = (28, 4)          # Qwen2.5-VL-7B: query and kv heads, head 128
FIELDS = dict(is_neox_style=True, base=1e6, max_position=4 * 32768)
SPECS = {
    "chunked [16,24,24]": RopeSpec(128, 128, sections=(16, 24, 24), **FIELDS),
    "interleaved [24,20,20]": RopeSpec.interleaved(128, 128, (24, 20, 20), **FIELDS),
    "glm_round_robin [16,24,24]": RopeSpec.glm_round_robin(128, 128, (16, 24, 24), **FIELDS),
    "ernie45 [22,22,20] gptj": RopeSpec.ernie45(128, 128, (22, 22, 20), **{**FIELDS, "is_neox_style": False}),
    "two_row_interleaved": RopeSpec.two_row_interleaved(128, 128, **FIELDS),
    "custom (T H W reversed)": RopeSpec.from_map(tuple(i % 3 for i in range(64))[::-1], head_size=128, **FIELDS),
    "chunked [16,24,24] gptj": RopeSpec(128, 128, sections=(16, 24, 24), **{**FIELDS, "is_neox_style": False}),
}
BASELINE_SPECS = ("chunked [16,24,24]", "interleaved [24,20,20]", "chunked [16,24,24] gptj")


def load_baseline(rev: str):
    """The rotation kernel module of commit ``rev``, imported under another name.  Only a commit whose
    rotary.py holds the whole kernel: from the split into rotary_kernel.py / rotary_plan.py / rotary.py,
    rotary.py imports the current tree's kernel and plan, so the "baseline" would be the current one."""
    split = subprocess.run(["git", "cat-file", "-e", f"{rev}:rope/triton/rotary_kernel.py"], capture_output=True)
    if split.returncode == 0:
        raise SystemExit(f"--baseline {rev}: its kernel is split over rotary_kernel.py and rotary_plan.py, which "
                         f"rotary.py imports from the current tree; compare with a commit before the split, or "
                         f"check that revision out in a worktree and run this there")
    source = subprocess.run(["git", "show", f"{rev}:rope/triton/rotary.py"], check=True, capture_output=True,
                            text=True).stdout
    path = Path(tempfile.mkdtemp()) / "rotary_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("rotary_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["rotary_baseline"] = module
    spec.loader.exec_module(module)
    return module


def _calls(launch, spec, tokens, device):
    """Bound calls of ``launch`` on enough input sets to leave the L2 (rope.harness.bench.input_sets)."""
    cache = cos_sin_cache(spec, torch.bfloat16, device)
    positions, q, k = bench._inputs(spec, tokens, *HEADS, torch.bfloat16, device)
    nbytes = bench.rotation_bytes(spec, tokens, *HEADS, 2)
    sets = [(positions.clone(), q.clone(), k.clone()) for _ in range(bench.input_sets(device, nbytes, tokens))]
    return [lambda p=p, a=a, b=b: launch(spec, p, a, b, cache) for p, a, b in sets], nbytes


def time_us(launch, spec, tokens, timer, device) -> tuple[float, int]:
    calls, nbytes = _calls(launch, spec, tokens, device)
    ms, _ = timer(calls, tokens)
    return ms * 1e3, nbytes


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="52faf89", help="the commit whose kernel is the baseline")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 4096, 16384])
    parser.add_argument("--repeats", type=int, default=3, help="A/B rounds per row (the median is kept)")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu under TRITON_INTERPRET=1 (a smoke run: "
                                                         "wall-clock times of the interpreter mean nothing)")
    args = parser.parse_args(argv)
    base = load_baseline(args.baseline)
    timer = bench._timer(args.device)
    copy = bench.copy_bandwidth(args.device)
    name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    print(f"device {name}, copy {copy:.0f} GB/s; heads {HEADS[0]}/{HEADS[1]} x 128, bf16; "
          f"baseline kernel {args.baseline}\n")
    print("| map | tokens | us | fraction of copy | vs chunked | baseline us | now/baseline |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for tokens in args.tokens:
        chunked_fraction = None
        for name, spec in SPECS.items():
            now, then = [], []
            for _ in range(args.repeats):
                us, nbytes = time_us(rotary.launch_rotary, spec, tokens, timer, args.device)
                now.append(us)
                if name in BASELINE_SPECS:
                    then.append(time_us(base.launch_rotary, spec, tokens, timer, args.device)[0])
            us = statistics.median(now)
            fraction = nbytes / (us * 1e-6) / 1e9 / copy
            if chunked_fraction is None:
                chunked_fraction = fraction
            old = f"{statistics.median(then):.2f}" if then else ""
            ratio = f"{us / statistics.median(then):.3f}" if then else ""
            print(f"| {name} | {tokens} | {us:.2f} | {fraction:.3f} | {fraction / chunked_fraction:.3f} | {old} | "
                  f"{ratio} |", flush=True)


if __name__ == "__main__":
    main()
