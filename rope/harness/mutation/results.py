"""The results and their JSON form (OUT/mutants.json, schema ``rope-harness/mutants/1``): one
record per pytest run, the parent controls, a mutant against one suite, the whole report, and the
exit status."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from rope.harness.mutation.catalogue import ROTATION_KINDS, Mutant

SCHEMA = "rope-harness/mutants/1"


@dataclass
class RunRecord:
    """One pytest subprocess of a mutant's suite."""
    stage: str
    command: str
    returncode: int
    wall_s: float
    pytest_s: float | None
    summary: str
    outcome: str            # caught | false-alarm | unrelated-failure | passed | crashed | timeout | error
    tests_run: int
    failing_test: str | None = None
    note: str = ""


@dataclass
class Control:
    """The failing test rerun on the mutant's parent."""
    test: str
    parent_test: str
    parent_failed: bool | None      # None: inconclusive (the parent's test did not run)
    wall_s: float
    summary: str


@dataclass
class SuiteResult:
    """A mutant against one suite (harness or baseline)."""
    suite: str
    status: str = "survived"        # caught | survived | timeout | crashed | error
    stage: str | None = None        # the stage that caught it
    test: str | None = None         # the test that caught it
    wall_s: float = 0.0
    pytest_s: float | None = None
    suite_s: float = 0.0            # pytest_s where reported, else wall_s, summed over runs
    slow: bool = False              # caught, but after more than the limit
    assertion: list = field(default_factory=list)
    falsifying_example: list = field(default_factory=list)
    excerpt: str = ""
    false_alarms: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    runs: list = field(default_factory=list)
    controls: list = field(default_factory=list)

    @property
    def caught(self) -> bool:
        return self.status == "caught"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["caught"] = self.caught
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> "SuiteResult | None":
        """The record :meth:`to_dict` wrote (its runs and controls as RunRecord and Control)."""
        if d is None:
            return None
        fields = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        fields["runs"] = [RunRecord(**r) for r in d.get("runs", [])]
        fields["controls"] = [Control(**c) for c in d.get("controls", [])]
        return cls(**fields)


def describe(s: SuiteResult | None) -> str:
    """One line: caught in how long by which test, or what happened instead."""
    if s is None:
        return "n/a"
    if s.caught:
        return f"caught in {s.suite_s:.1f} s{' (SLOW)' if s.slow else ''} by {s.test}"
    return f"{s.status.upper()} after {s.wall_s:.1f} s"


@dataclass
class MutantResult:
    mutant: Mutant
    harness: SuiteResult
    baseline: SuiteResult | None = None
    drawn: SuiteResult | None = None        # the harness with its fixed cases off

    def to_dict(self) -> dict:
        return {**asdict(self.mutant), "dedicated": self.mutant.kind == "dispatch",
                "harness": self.harness.to_dict(), "baseline": self.baseline.to_dict() if self.baseline else None,
                "drawn": self.drawn.to_dict() if self.drawn else None}

    @classmethod
    def from_dict(cls, d: dict) -> "MutantResult":
        return cls(Mutant.from_dict(d), SuiteResult.from_dict(d["harness"]), SuiteResult.from_dict(d.get("baseline")),
                   SuiteResult.from_dict(d.get("drawn")))


@dataclass
class MutationReport:
    results: list
    profile: str
    limit_s: float
    budget_s: float
    jobs: int
    baseline: bool
    confirm: bool
    total_wall_s: float = 0.0
    created: str = ""
    not_run: list = field(default_factory=list)     # (mutant name, why this machine cannot run it)
    drawn: bool = False                             # the drawn-only suite was run

    def summary(self) -> dict:
        def side(pairs):
            caught = [(n, s) for n, s in pairs if s.caught]
            return {"mutants": len(pairs), "caught": len(caught),
                    "suite_s_total": round(sum(s.suite_s for _, s in pairs), 2),
                    "suite_s_caught_total": round(sum(s.suite_s for _, s in caught), 2),
                    "slow": [n for n, s in caught if s.slow],
                    "not_caught": [n for n, s in pairs if not s.caught],
                    "false_alarms": sum(len(s.false_alarms) for _, s in pairs)}
        harness = [(r.mutant.name, r.harness) for r in self.results]
        baseline = [(r.mutant.name, r.baseline) for r in self.results if r.baseline is not None]
        rotation = [(r.mutant.name, r.harness) for r in self.results if r.mutant.kind in ROTATION_KINDS]
        drawn = [(r.mutant.name, r.drawn) for r in self.results if r.drawn is not None]
        return {"harness": side(harness), "baseline": side(baseline) if self.baseline else None,
                "drawn": side(drawn) if self.drawn else None,
                "drawn_not_run": [r.mutant.name for r in self.results if self.drawn and r.drawn is None],
                "harness_on_rotation_mutants": side(rotation),
                "survivors": [r.mutant.name for r in self.results if not r.harness.caught],
                "not_run": [{"mutant": n, "reason": why} for n, why in self.not_run]}

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "created": self.created, "profile": self.profile, "limit_s": self.limit_s,
                "budget_s": self.budget_s, "jobs": self.jobs, "baseline": self.baseline, "drawn": self.drawn,
                "confirm": self.confirm,
                "total_wall_s": round(self.total_wall_s, 2), "summary": self.summary(),
                "mutants": [r.to_dict() for r in self.results]}

    @classmethod
    def from_dict(cls, d: dict) -> "MutationReport":
        """The report a ``mutants.json`` holds (schema :data:`SCHEMA`): what the markdown is rendered
        from, so a committed report's table can be recomputed from its JSON."""
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise ValueError(f"schema={d.get('schema') if isinstance(d, dict) else None!r}: expected {SCHEMA!r}")
        not_run = [(n["mutant"], n["reason"]) for n in d.get("summary", {}).get("not_run", [])]
        return cls([MutantResult.from_dict(m) for m in d["mutants"]], d["profile"], d["limit_s"], d["budget_s"],
                   d["jobs"], d["baseline"], d["confirm"], d.get("total_wall_s", 0.0), d.get("created", ""),
                   not_run, d.get("drawn", False))


def exit_code(report: MutationReport) -> int:
    """0 when the harness caught every mutant and, where it ran, the drawn cases alone caught every
    mutant they were run on; else 1 (slow catches are flagged, not failed)."""
    return 0 if all(r.harness.caught and (r.drawn is None or r.drawn.caught) for r in report.results) else 1
