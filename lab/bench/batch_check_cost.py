"""Harness cost per case of the batched rotation check (rope.harness.rotation.batch) against the
one-case check, on one device: python -m lab.bench.batch_check_cost [IMPL] [DEVICE]."""
import time, torch
from rope.registry import get_implementation
from rope.harness.rotation.batch import check_batch
from rope.harness.rotation.check import evaluate_case
from rope.harness.rotation.cases import RotationCase
from rope.spec import RopeSpec
import sys
name = sys.argv[1] if len(sys.argv) > 1 else "native"; dev = sys.argv[2] if len(sys.argv) > 2 else "cpu"
fn = get_implementation(name)
spec = RopeSpec(128, 128, True, (16, 24, 24), max_position=32768)
for n in (1, 16, 64):
    cases = [RotationCase(spec, 1 + (i * 7) % 48, 8, 2, "bfloat16", "uniform", i % 2 == 0, seed=i) for i in range(n)]
    check_batch(name, fn, cases[:2], dev); evaluate_case(name, fn, cases[0], dev)   # warm
    t = time.perf_counter(); v = check_batch(name, fn, cases, dev); tb = time.perf_counter() - t
    assert all(x.passed for x in v)
    t = time.perf_counter()
    for c in cases: assert evaluate_case(name, fn, c, dev).comparison.ok
    ts = time.perf_counter() - t
    print(f"{name} {dev} batch of {n}: batched {tb/n*1e3:.2f} ms/case, one at a time {ts/n*1e3:.2f} ms/case ({ts/tb:.2f}x)")
from rope.harness import profiling
profiling._seconds.clear(); profiling._counts.clear()
cases = [RotationCase(spec, 1 + (i * 7) % 48, 8, 2, "bfloat16", "uniform", i % 2 == 0, seed=i) for i in range(64)]
t=time.perf_counter(); check_batch(name, fn, cases, dev); print("total", time.perf_counter()-t)
print(dict(profiling._seconds))
profiling._seconds.clear()
t=time.perf_counter()
for c in cases: evaluate_case(name, fn, c, dev)
print("single total", time.perf_counter()-t, dict(profiling._seconds))
