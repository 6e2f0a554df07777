"""How often the diagnosis names the right cause: for every rotation mutant of the catalogue
(properties/mutants) and every hand-written bug (tests/harness/handwritten_bugs.py), the share of
its failures, over the rotation properties' drawn cases, that carry its label.

    python -m tests.harness.diagnosis_accuracy [--failures N] [--rounds R] [--per-variant K]
                                               [--only NAME ...] [--write docs/mutation.md]

Each subject runs on the cases test_rotation_matches_reference draws (every dtype, kind and
pairing it runs, ``rotation_cases`` with NaN/inf planted or not), a few examples per variant per
round, each round from another Hypothesis seed, no shrinking, until it has ``--failures`` failing
cases or ``--rounds`` rounds are done; after FOCUS_AFTER rounds over every variant, only over the
variants the subject failed in.  A failing case is diagnosed as the suite diagnoses it
(rope.harness.rotation.check.diagnose_mismatch; on guarded inputs, rope.harness.rotation.guards.diagnose_guarded,
for the memory-safety mutants only the guards see).  Prints the table; ``--write`` puts it into the
file between the markers ``<!-- diagnosis-accuracy -->`` and ``<!-- /diagnosis-accuracy -->``.
Exit status 1 when a subject's share is below TARGET, or a subject has no failure at all.

Test-side: it imports the hand-written bugs from tests/, which no shipped package may import.
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    # Run as a command: the kernel mutants under the interpreter on a machine without a GPU.  Never on
    # import: the tests that import this module share their process with GPU tests.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse
import dataclasses
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings, strategies as st

from rope.harness.rotation.guards import diagnose_guarded
from properties.mutants.broken_rotations import BROKEN_ROTATIONS
from properties.mutants.kernel import ROTARY_MUTANTS
from properties.mutants.dispatch import BROKEN_OPS
from properties.rotation.scaled_cases import scaled_rotation_cases
from properties.strategies import (DTYPES, KINDS, build_rotation_inputs, prefill_cases, rotation_cases,
                                   supported_shapes)
from rope.harness.rotation.check import diagnose_mismatch, evaluate_case
from rope.harness.rotation.diagnosis import diagnose
from rope.native import rotate_native
from rope.harness.mutation import discover_mutants
from tests.harness.handwritten_bugs import BUGS

TARGET = 0.9
FOCUS_AFTER = 2                 # rounds over every variant before the rounds over the failing ones
PREFILL_FAILURES = 5            # failing cases of a prefill-size subject at most (each a 4,096-token run)
BEGIN, END = "<!-- diagnosis-accuracy -->", "<!-- /diagnosis-accuracy -->"
COMMAND = "python -m tests.harness.diagnosis_accuracy --write docs/mutation.md"

# Every catalogue mutant with a rotation output -> (how its failures are seen, the label they must carry).
# "plain": the rotation properties' check; "guarded": on guarded inputs (rope/harness/guards.py), the
# memory-safety bugs whose values are right on plain inputs; "prefill": prefill-size cases (the
# prefill property's draws), for a bug on a path chosen by token count; "op": a dispatch op class
# called twice (test_dispatch.py's check); "scaled": the scaled-table property's draws
# (properties/rotation/test_scaled_tables.py), for a bug in how the table is read; "view": the cases
# of the view property (properties/rotation/test_views.py), for a bug only a strided view shows.
MUTANT_LABELS = {
    "broken_rotations:neox_for_gptj": ("plain", "pairing_swapped"),
    "broken_rotations:chunked_for_interleaved": ("plain", "axis_map_wrong"),
    "broken_rotations:chunked_for_two_row": ("plain", "axis_map_wrong"),
    "broken_rotations:glm_round_robin_without_skip": ("plain", "axis_map_wrong"),
    "broken_rotations:ernie45_h_w_swapped": ("plain", "position_rows_swapped"),
    "broken_rotations:row_map_shifted_by_one": ("plain", "axis_map_wrong"),
    "broken_rotations:key_unrotated": ("plain", "key_only"),
    "broken_rotations:touches_pass_through": ("plain", "pass_through_touched"),
    "broken_rotations:first_pow2_heads": ("plain", "head_subset"),
    "broken_rotations:assumes_contiguous": ("plain", "row_stride_ignored"),
    "broken_rotations:bf16_claiming_fp32": ("plain", "precision_loss"),
    "broken_rotations:hides_nonfinite": ("plain", "nan"),
    "broken_rotations:fp32_table_rounded_to_activations": ("scaled", "table_misread"),
    "broken_rotations:table_clamped_to_unit": ("scaled", "table_misread"),
    "broken_rotations:fast_math_angles": ("scaled", "angle_error"),
    "broken_rotations:heads_at_contiguous_stride": ("view", "view_misread"),
    "broken_rotations:rows_as_wide_as_stride": ("view", "wrote_outside_view"),
    "kernel:neox_for_gptj": ("plain", "pairing_swapped"),
    "kernel:cos_sin_unmasked": ("guarded", "out_of_bounds_read"),
    "kernel:cos_sin_unmasked_head_padded": ("guarded", "out_of_bounds_read"),
    "kernel:partial_rotary_head_half": ("plain", "partial_rotary_stride"),
    "kernel:interleaved_h_bound_off_by_one": ("plain", "section_boundary_shifted"),
    "kernel:interleaved_thw_order_swapped": ("plain", "position_rows_swapped"),
    "kernel:row_map_table_shifted": ("plain", "axis_map_wrong"),
    "kernel:positions_rows_packed": ("guarded", "wrong_positions"),
    "kernel:positions_rows_at_token_offsets": ("plain", "position_rows_misread"),
    "kernel:neox_pairs_from_4096_tokens": ("prefill", "pairing_swapped"),
    "dispatch:mrope_cached_cos_sin": ("op", "wrong_positions"),
}
# The catalogue's other mutants give no rotation output to label: the positions and position-id
# mutants (a position check; rope.harness.position_ids' own diagnosis), the dispatch ops that raise
# or take a wrong positions shape with right values, and the GPU-only ones (a GPU, deep profile).
# Kinds whose diagnosis is their own slice's (a rotation label measures nothing there).
NOT_LABELLED = ("positions", "positions-kernel", "position-ids", "dispatch", "table", "fused")


@dataclass
class Subject:
    name: str
    fn: object
    label: str
    how: str = "plain"
    slip: str = ""


@dataclass
class Tally:
    subject: Subject
    cases: int = 0
    labels: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def failures(self) -> int:
        return sum(self.labels.values())

    @property
    def right(self) -> int:
        """Failures with the subject's label, and failures whose values were right, named by what the
        guards saw (:data:`VALUES_RIGHT`)."""
        return self.labels[self.subject.label] + sum(n for label, n in self.labels.items()
                                                     if label.endswith(VALUES_RIGHT))

    @property
    def share(self) -> float:
        return self.right / self.failures if self.failures else 0.0


def subjects(only=()) -> list[Subject]:
    """The catalogue's rotation mutants (every one MUTANT_LABELS names), then the hand-written bugs."""
    out = []
    for name, (how, label) in MUTANT_LABELS.items():
        module, attr = name.split(":")
        fn = {"kernel": ROTARY_MUTANTS, "dispatch": {k: cls for k, (_, cls) in BROKEN_OPS.items()}}.get(
            module, BROKEN_ROTATIONS)[attr]
        out.append(Subject(name, fn, label, how, _first_line(fn.__doc__)))
    out += [Subject(f"handwritten:{name}", bug.fn, bug.label, "plain", bug.slip) for name, bug in BUGS.items()]
    return [s for s in out if not only or any(o == s.name or o == s.name.split(":")[1] for o in only)]


def _first_line(doc) -> str:
    return " ".join((doc or "").strip().split("\n\n", 1)[0].split())


# A failure whose output values are right (on plain inputs the subject matches the reference; only
# the guards and the tracer see its reads or writes) has no wrong value to name: its right label is
# what the guards saw, whatever the bug does where its values go wrong.  Tallied as "<label> (values
# right)" and counted right for every subject.
MEMORY_LABELS = ("out_of_bounds_read", "writes_outside")
VALUES_RIGHT = " (values right)"


def _label(subject: Subject, case) -> str | None:
    """The diagnosis label of ``case`` when the subject fails it, else None."""
    if subject.how == "op":
        return _op_label(subject.fn, case)
    if subject.how == "guarded":
        d = diagnose_guarded(subject.fn, case)
        if d.label == "match":
            return None
        if d.label in MEMORY_LABELS and d.label != subject.label and \
                evaluate_case(subject.name, subject.fn, case, "cpu").comparison.ok:
            return d.label + VALUES_RIGHT
        return d.label
    run = evaluate_case(subject.name, subject.fn, case, "cpu")
    if run.comparison.ok:
        return None
    return diagnose_mismatch(subject.fn, case, run).label


def _op_label(op_class, case) -> str | None:
    """An op class called twice, as test_dispatch.py does: first on other positions of the same
    length, then on the case; None where it passes (or the op takes no such spec)."""
    x = build_rotation_inputs(case)
    first = build_rotation_inputs(dataclasses.replace(case, seed=case.seed + 1))
    try:
        op = op_class(case.spec, DTYPES[case.dtype], platform="cpu", custom_ops=False)
        op(first.positions, first.query.clone(), None if first.key is None else first.key.clone())
        q, k = op(x.positions, x.query.clone(), None if x.key is None else x.key.clone())
    except (ValueError, NotImplementedError):
        return None                              # a spec the op does not take
    d = diagnose(case.spec, x.positions, x.query, x.key, x.cache, q, k, precision=rotate_native.working_precision)
    return None if d.label == "match" else d.label


def _variants(subject: Subject) -> list[tuple]:
    """(dtype, kind, is_neox_style, narrowed rotation_cases arguments) the subject runs, as
    test_rotation_matches_reference parametrizes them."""
    return [(dtype, kind, neox, narrowed) for dtype in DTYPES for kind in KINDS for neox in (True, False)
            if (narrowed := supported_shapes(subject.name, subject.fn, kind, neox, dtype, "cpu")) is not None]


def measure(subject: Subject, *, failures: int, rounds: int, per_variant: int = 3) -> Tally:
    """Draw cases round by round until ``failures`` failing cases (or ``rounds`` rounds)."""
    tally, seen = Tally(subject), set()
    start = time.perf_counter()
    if subject.how == "op":
        strategies = [rotation_cases(dtype=dtype, kind=kind, is_neox_style=neox, nonfinite=True)
                      for dtype in DTYPES for kind in ("chunked3", "chunked4", "interleaved") for neox in (True, False)]
    elif subject.how == "prefill":
        # The switch's own boundary, few small heads: every example is a kernel run of 4,096 tokens
        # (under the interpreter, seconds each).
        failures = min(failures, PREFILL_FAILURES)
        strategies = [prefill_cases(tokens=st.sampled_from((4096, 4097)), small_heads=True)]
    elif subject.how == "scaled":
        strategies = [scaled_rotation_cases()]
    elif subject.how == "view":
        from properties.rotation.views import view_cases
        strategies = [view_cases(dtype=dtype, kind=kind, is_neox_style=neox, **narrowed)
                      for dtype, kind, neox, narrowed in _variants(subject)]
    else:
        strategies = [rotation_cases(dtype=dtype, kind=kind, is_neox_style=neox, nonfinite=True, **narrowed)
                      for dtype, kind, neox, narrowed in _variants(subject)]

    failing = Counter()                   # variant -> failures found there

    def visit(case, variant):
        if case in seen or tally.failures >= failures:
            return
        seen.add(case)
        tally.cases += 1
        label = _label(subject, case)
        if label is not None:
            tally.labels[label] += 1
            failing[variant] += 1

    for r in range(rounds):
        # From the third round on, only the variants the subject has failed in (a bug of one layout
        # fails in few of them): the same draws for the same subject, a shorter run.
        chosen = [i for i in range(len(strategies)) if r < FOCUS_AFTER or failing[i]] or range(len(strategies))
        for i in chosen:
            if tally.failures >= failures:
                break
            run = settings(max_examples=per_variant, database=None, deadline=None, phases=[Phase.generate],
                           suppress_health_check=list(HealthCheck))(given(case=strategies[i])(_visitor(visit, i)))
            seed(r * 1000 + i)(run)()
        if tally.failures >= failures:
            break
    tally.seconds = time.perf_counter() - start
    return tally


def _visitor(visit, variant):
    def check(case):
        visit(case, variant)
    return check


def table(tallies: list[Tally]) -> str:
    lines = ["| bug | slip | label it must get | failures | right | share | other labels |",
             "|---|---|---|---:|---:|---:|---|"]
    for t in tallies:
        others = ", ".join(f"{label} {n}" for label, n in t.labels.most_common() if label != t.subject.label)
        slip = t.subject.slip.replace("|", "/")
        if len(slip) > 90:
            slip = slip[:87] + "..."
        lines.append(f"| `{t.subject.name}` | {slip} | `{t.subject.label}` | {t.failures} | {t.right} | "
                     f"{100 * t.share:.0f}% | {others or '-'} |")
    return "\n".join(lines)


def section(tallies: list[Tally], args) -> str:
    low = [t.subject.name for t in tallies if t.share < TARGET]
    return "\n".join([
        BEGIN,
        f"Regenerate with `{COMMAND}` (here: {args.failures} failing cases per bug at most, {args.rounds} rounds "
        f"of {args.per_variant} examples per variant; CPU, Triton kernels under the interpreter).",
        "",
        table(tallies),
        "",
        f"{sum(t.right for t in tallies)} of {sum(t.failures for t in tallies)} failures carry the right label; "
        + (f"below {TARGET:.0%}: {', '.join(low)}." if low else f"every bug at {TARGET:.0%} or more."),
        END,
    ])


def write(path: Path, text: str) -> None:
    doc = path.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(doc):
        raise SystemExit(f"{path}: no {BEGIN} ... {END} markers to write the table between")
    path.write_text(pattern.sub(lambda _: text, doc))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.harness.diagnosis_accuracy", description=__doc__.split("\n\n")[0])
    p.add_argument("--failures", type=int, default=20, help="failing cases per bug to stop at (default 20)")
    p.add_argument("--rounds", type=int, default=12,
                   help=f"rounds at most (default 12): every variant in the first {FOCUS_AFTER}, then the variants "
                        f"the bug failed in")
    p.add_argument("--per-variant", type=int, default=3, help="examples per variant per round (default 3)")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="this bug only; repeatable")
    p.add_argument("--write", type=Path, default=None, metavar="DOC", help="write the table into DOC")
    args = p.parse_args(argv)
    # Wrong only in a mode or only in the backward: labelled by the mode's or the backward's check.
    from properties.mutants.broken_backwards import BACKWARD_ONLY
    from properties.mutants.broken_rotations import MODE_ONLY
    elsewhere = {f"broken_rotations:{n}" for n in MODE_ONLY} | {f"broken_backwards:{n}" for n in BACKWARD_ONLY}
    missing = sorted(m.name for m in discover_mutants() if m.kind not in NOT_LABELLED and not m.needs
                     and m.name not in MUTANT_LABELS and m.name not in elsewhere)
    if missing:
        print(f"rotation mutants without an expected label: {', '.join(missing)}", file=sys.stderr)
        return 2
    tallies = []
    for subject in subjects(args.only):
        t = measure(subject, failures=args.failures, rounds=args.rounds, per_variant=args.per_variant)
        print(f"{subject.name}: {t.right}/{t.failures} right ({100 * t.share:.0f}%) of {t.cases} cases in "
              f"{t.seconds:.1f} s; {dict(t.labels)}", file=sys.stderr, flush=True)
        tallies.append(t)
    text = section(tallies, args)
    print(text)
    if args.write:
        write(args.write, text)
    return 0 if all(t.failures and t.share >= TARGET for t in tallies) else 1


if __name__ == "__main__":
    sys.exit(main())
