"""How long the suite takes to report a bug it has no fixed case for.

The mutants of properties/mutants are the bugs this field has shipped, and each has a fixed
known-bug case that catches it in seconds.  The wrappers here are broken in new ways, each
under a condition the properties must draw their way to (the last token, a GQA key, fp16 with
partial rotary, many heads, 4 position rows); the question is how long a kernel engineer waits
for the first failure of ``pytest -x -n 2`` over the rotation properties (the CI profile).

    python -m lab.bench.first_failure [--only NAME ...] [--timeout S]

prints, per wrapper, pytest's own duration to the first failure, the wall time and the failing
test.  Each wrapper runs the harness's Triton kernel and then breaks its output.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _kernel():
    from rope.registry import get_implementation
    return get_implementation("triton")


def _broken(condition, corrupt):
    """A wrapper of the Triton kernel: where ``condition(spec, positions, query, key)`` holds,
    ``corrupt(spec, q_in, k_in, q_out, k_out)`` breaks the outputs (q_in, k_in: copies of the inputs)."""
    def rotate(spec, positions, query, key, cache):
        q_in = query.clone()
        k_in = key.clone() if key is not None else None
        q_out, k_out = _kernel()(spec, positions, query, key, cache)
        if condition(spec, positions, query, key):
            corrupt(spec, q_in, k_in, q_out, k_out)
        return q_out, k_out
    rotate.working_precision = "float32"
    return rotate


def _restore_last_token(spec, q_in, k_in, q_out, k_out):
    q_out[-1].copy_(q_in[-1])


def _restore_first_kv_head(spec, q_in, k_in, q_out, k_out):
    k_out[:, :spec.head_size].copy_(k_in[:, :spec.head_size])


def _zero_last_channel(spec, q_in, k_in, q_out, k_out):
    q_out[:, spec.head_size - 1::spec.head_size] = 0


def _restore_head_31(spec, q_in, k_in, q_out, k_out):
    q_out[:, 31 * spec.head_size:32 * spec.head_size].copy_(q_in[:, 31 * spec.head_size:32 * spec.head_size])


def _negate_first_pair(spec, q_in, k_in, q_out, k_out):
    q_out[:, 0] = -q_out[:, 0]


# The last token of a batch of 3 or more left unrotated (a tile's tail mask off by one).
last_token_unrotated = _broken(lambda spec, pos, q, k: q.shape[0] >= 3, _restore_last_token)
# GQA: the first kv head left unrotated when there are fewer kv heads than query heads.
gqa_first_kv_head_unrotated = _broken(
    lambda spec, pos, q, k: k is not None and 0 < k.shape[1] < q.shape[1], _restore_first_kv_head)
# fp16 with partial rotary: the last pass-through channel of each head zeroed (a copy-back bug).
fp16_partial_pass_through_zeroed = _broken(
    lambda spec, pos, q, k: str(q.dtype) == "torch.float16" and spec.rotary_dim < spec.head_size, _zero_last_channel)
# 32 or more query heads: head 31 left unrotated (a head-block loop bound).
head_31_unrotated = _broken(lambda spec, pos, q, k: q.shape[1] // spec.head_size >= 32, _restore_head_31)
# 4 position rows (XD-RoPE): the first rotated channel negated.
xd4_first_channel_negated = _broken(lambda spec, pos, q, k: spec.num_dims == 4 and q.shape[0] > 0,
                                    _negate_first_pair)

def _last_row_clamped(spec, positions, query, key, cache):
    # The cache's last row never read: a position at max_position - 1 takes row max_position - 2.
    clamped = positions.clamp(max=max(spec.max_position - 2, 0))
    return _kernel()(spec, clamped, query, key, cache)


last_row_clamped = _last_row_clamped
last_row_clamped.working_precision = "float32"
# q and k packed in one qkv tensor (row-strided views): the key left unrotated.
packed_key_unrotated = _broken(lambda spec, pos, q, k: k is not None and not k.is_contiguous(),
                               lambda spec, q_in, k_in, q_out, k_out: k_out.copy_(k_in))

WRAPPERS = ("last_token_unrotated", "gqa_first_kv_head_unrotated", "fp16_partial_pass_through_zeroed",
            "head_31_unrotated", "xd4_first_channel_negated", "last_row_clamped", "packed_key_unrotated")
FILES = ("properties/rotation/test_rotation.py", "properties/rotation/test_model_rotation.py")


def measure(name: str, timeout: float) -> dict:
    env = {**os.environ, "CI": "true", "ROPE_CASES_DIR": "off", "ROPE_NO_REPORT": "1",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-n", "2", "-q", "-p", "no:cacheprovider", *FILES,
           "--rope-impl", f"lab.bench.first_failure:{name}"]
    began = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        out, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out, code = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""), None
    wall = time.monotonic() - began
    suite = re.search(r" in ([0-9.]+)s", out)
    failed = re.search(r"^FAILED (\S+)", out, re.M)
    # Exit 1, or 2 when xdist stopped the other worker after the failure (-x).
    return {"wrapper": name, "caught": code in (1, 2) and failed is not None,
            "suite_s": float(suite.group(1)) if suite else None,
            "wall_s": round(wall, 1), "test": failed.group(1) if failed else None, "exit": code}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], choices=WRAPPERS)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    print("| wrapper | caught | suite s to first failure | wall s | failing test |")
    print("|---|---|---:|---:|---|")
    for name in args.only or WRAPPERS:
        r = measure(name, args.timeout)
        print(f"| {r['wrapper']} | {'yes' if r['caught'] else 'NO (exit %s)' % r['exit']} | {r['suite_s']} | "
              f"{r['wall_s']} | {r['test']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
