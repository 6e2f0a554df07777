"""How many Triton compiles the rotation property's draws cost on a GPU, counted on any machine.

A campaign on the H200 spends most of its time compiling new specializations of the rotation
kernel (lab/perf-notes.md §10-§12, §23): every distinct set of constexprs, argument types,
divisibility attributes and compile options (``num_warps``, ``launch_pdl``) is a compile.  This
draws ``--examples`` cases per (dtype, kind, pairing) from the same strategy as
``test_rotation_matches_reference``, records the launch the GPU launcher would make for each (PDL
available, as on an H200; no kernel runs) and counts the distinct specializations, for the
default launch and for each ``--options`` variant beside it.

    TRITON_INTERPRET=0 python -m lab.bench.compile_census [--examples 1000] [--options '{"speculate_positions": false}' ...]

Prints one line per launch variant: examples, launches, distinct specializations, and the launches
per compile; then how the default's specializations split by what differs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys



def specialization(kernel, args, kwargs) -> tuple:
    """Triton's cache key for one launch, as far as it varies between launches of one kernel: the
    argument types and the divisibility/equal-to-one attributes of the arguments it specializes
    (``do_not_specialize`` honoured), the constexprs and the compile options."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    from tests.kernels.compile_offline import launch_signature
    signature, constexprs, options = launch_signature(kernel, args, kwargs)
    skip = {kernel.arg_names[i] if isinstance(i, int) else i for i in (kernel.do_not_specialize or ())}
    attributes = tuple((name, signature[name], "" if name in skip else
                        str(native_specialize_impl(BaseBackend, value, False, True, True)[1]))
                       for name, value in zip(kernel.arg_names, args))
    return attributes, tuple(sorted(constexprs.items())), tuple(sorted(options.items()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=1000, help="draws per (dtype, kind, pairing)")
    parser.add_argument("--options", action="append", default=[], type=json.loads,
                        help="launch options (JSON) counted beside the default; repeatable")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        parser.error("run with TRITON_INTERPRET=0: the interpreter replaces the kernels at import")

    from hypothesis import HealthCheck, Phase, given, seed, settings, strategies as st

    import rope.triton.rotary as rotary
    from tests.kernels.compile_offline import record_launches
    from properties.strategies import DTYPES, KINDS, build_rotation_inputs, rotation_cases

    variants = [("default", {})] + [(json.dumps(o, sort_keys=True), o) for o in args.options]
    keys = {name: collections.Counter() for name, _ in variants}
    drawn = [0]

    def census(dtype: str, kind: str, neox: bool):
        @seed(args.seed)
        @settings(max_examples=args.examples, database=None, phases=[Phase.generate], deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(data=st.data())
        def draw(data):
            case = data.draw(rotation_cases(dtype=dtype, kind=kind, is_neox_style=neox, nonfinite=True))
            x = build_rotation_inputs(case, "cpu")
            # As the public entry hands q/k to the launcher: unit stride in the last dim.
            q, k = rotary._unit_last_stride(x.query), rotary._unit_last_stride(x.key)
            drawn[0] += 1
            for name, options in variants:
                for kernel, _grid, a, kw in record_launches(rotary, "_rotary_kernel", lambda: rotary.launch_rotary(
                        case.spec, x.positions, q, k, x.cache, **options)):
                    keys[name][specialization(kernel, a, kw)] += 1
        draw()

    for dtype in DTYPES:
        for kind in KINDS:
            for neox in (True, False):
                census(dtype, kind, neox)
        print(f"{dtype}: {drawn[0]} examples drawn", file=sys.stderr, flush=True)

    for name, counter in keys.items():
        launches = sum(counter.values())
        print(f"{name}: {drawn[0]} examples, {launches} launches, {len(counter)} distinct specializations "
              f"({launches / max(1, len(counter)):.1f} launches per compile)")
    default = keys["default"]
    print("default, distinct specializations without each difference (fewer: that difference splits them):")
    fields = [("options " + o, lambda key, o=o: (key[0], key[1], tuple(x for x in key[2] if x[0] != o)))
              for o in sorted({name for key in default for name, _ in key[2]})]
    fields += [("constexpr " + c, lambda key, c=c: (key[0], tuple(x for x in key[1] if x[0] != c), key[2]))
               for c in sorted({name for key in default for name, _ in key[1]})]
    fields += [("attribute of " + a, lambda key, a=a: (tuple(x for x in key[0] if x[0] != a), key[1], key[2]))
               for a in sorted({name for key in default for name, _, attribute in key[0] if attribute})]
    fields += [("every attribute", lambda key: (tuple(x[:2] for x in key[0]), key[1], key[2]))]
    # The tile splits as one: a constexpr dropped alone can leave its partners telling launches apart.
    tile = ("BLOCK_T", "BLOCK_H", "BLOCK_HK")
    fields += [("the tile (BLOCK_T, BLOCK_H, BLOCK_HK, num_warps)", lambda key: (
        key[0], tuple(x for x in key[1] if x[0] not in tile), tuple(x for x in key[2] if x[0] != "num_warps")))]
    for label, project in fields:
        merged = len({project(key) for key in default})
        if merged < len(default):
            print(f"  {label}: {len(default)} -> {merged}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
