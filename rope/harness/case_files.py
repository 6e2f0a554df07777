"""Case files: a mismatch, recorded well enough to replay it on any machine.  This module is what
every kind of case file shares (the envelope); each checked thing's slice owns its kind: its record,
its loader and its replay (``rope.harness.rotation.case_file``, ``rope.harness.position_ids.case_file``).

Every case file is a JSON object with ``schema_version`` and ``kind``; a kind registers its name and
the newest schema version this code reads of it (:func:`register_kind`).  :func:`read_header` is the
one reader of every kind: the JSON, the schema version and the kind, each a ValueError naming the file
and the field; a file without ``kind`` predates kinds and is read as ``"rotation"``.  The dispatch of a
file to its kind's replay is rope.harness.repro's.

When a check finds a mismatch it writes ``reports/cases/<id>.json`` (or ``$ROPE_CASES_DIR/<id>.json``);
``rope-harness repro FILE`` and ``pytest --rope-repro FILE`` replay it.  Promoting a case to the
regression corpus is copying the file into ``properties/regressions/``.

Non-finite floats (an infinite error/bound ratio, a NaN output) are written as the strings
"inf", "-inf", "nan", so files are strict JSON.

Writing is atomic (temporary file in the same directory, fsync, ``os.replace``): safe with
pytest-xdist workers and concurrent runs; the same mismatch (same id) overwrites its own file.
``ROPE_CASES_DIR`` picks the directory; ``ROPE_CASES_DIR=off`` (or ``0``, ``none``, empty) turns
case files off.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from rope.harness.atomic import atomic_write
from rope.harness.causes import LINE_WIDTH

# Each kind of case file and the newest schema version this code reads of it (register_kind).
KINDS: dict[str, int] = {}
# The kind of a file written before case files had kinds.
UNMARKED_KIND = "rotation"
CASES_DIR_ENV = "ROPE_CASES_DIR"
_OFF = ("", "0", "off", "none", "false", "no")


def register_kind(kind: str, schema_version: int) -> str:
    """Declare a kind of case file and the newest schema version this code reads of it (each
    slice's case_file module, at import); returns ``kind``."""
    if KINDS.get(kind, schema_version) != schema_version:
        raise ValueError(f"kind={kind!r}: registered twice with different schema versions "
                         f"({KINDS[kind]} and {schema_version})")
    KINDS[kind] = schema_version
    return kind


# --------------------------------------------------------------------------- where and who
def cases_dir() -> Path | None:
    """Where case files go: $ROPE_CASES_DIR, else ``cases/`` of the reports directory
    (``./reports/cases``, rope.harness.output_dir.reports_dir); None when turned off."""
    value = os.environ.get(CASES_DIR_ENV)
    if value is None:
        from rope.harness.output_dir import reports_dir
        return reports_dir() / "cases"
    if value.strip().lower() in _OFF:
        return None
    return Path(value)


def implementation_path(name: str, fn, resolve) -> str:
    """A string ``resolve`` (the kind's registry lookup) resolves to ``fn``: ``name`` when it
    does, else ``module:qualname`` when that does, else ``name`` (a replay then needs ``--impl``)."""
    candidates = [name]
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if module and qualname and module != "__main__" and "<locals>" not in qualname:
        candidates.append(f"{module}:{qualname}")
    for candidate in candidates:
        try:
            if resolve(candidate) is fn:
                return candidate
        except ValueError:
            continue
    return name


def tensor_digest(t) -> str | None:
    """sha256 of a tensor's values (dtype, shape and bytes in row-major order)."""
    if t is None:
        return None
    import torch
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def versions(device: str) -> dict:
    """Versions of what produced the numbers, and the device's name."""
    out = {"python": platform.python_version()}
    for dist in ("torch", "triton", "transformers", "hypothesis", "rope-harness"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    import torch
    out["torch"] = torch.__version__
    name = platform.processor() or platform.machine()
    with contextlib.suppress(Exception):
        if device in ("cuda", "rocm"):
            name = torch.cuda.get_device_name()
        elif device == "xpu":
            name = torch.xpu.get_device_name()
    out["device_name"] = name
    out["triton_interpret"] = os.environ.get("TRITON_INTERPRET")
    return out


# --------------------------------------------------------------------------- record
def finite(value):
    """Non-finite floats as strings, recursively (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


# The case files this process created (not those it wrote over), in order: a test that ends as an
# expected failure takes back the ones it created (rope.harness.plugin, :func:`remove_created_since`).
_CREATED: list[Path] = []


def write_case(record: dict, directory: Path | str | None = None) -> Path:
    """Write ``record`` to ``<directory>/<id>.json`` atomically; returns the path.

    The text goes to a temporary file in the same directory, is flushed and fsynced, then
    ``os.replace``d over the target: a reader (or a concurrent writer of the same id) only ever
    sees a complete file.
    """
    directory = Path(directory) if directory is not None else cases_dir()
    if directory is None:
        raise ValueError(f"{CASES_DIR_ENV}={os.environ.get(CASES_DIR_ENV)!r}: case files are turned off")
    text = json.dumps(finite(record), indent=2, allow_nan=False) + "\n"
    target = directory / f"{record['id']}.json"
    existed = target.exists()
    path = atomic_write(target, text.encode("utf-8"))
    if not existed:
        _CREATED.append(path)
    return path


def created_count() -> int:
    """How many case files this process has created: the mark :func:`remove_created_since` takes."""
    return len(_CREATED)


def remove_created_since(mark: int) -> list[Path]:
    """Remove the case files this process created after ``mark`` (a test whose mismatch turned out
    expected: ``pytest.xfail`` called in its body); returns them."""
    removed, _CREATED[mark:] = _CREATED[mark:], []
    for path in removed:
        with contextlib.suppress(OSError):
            path.unlink()
    return removed


# --------------------------------------------------------------------------- load
@dataclass(frozen=True)
class LoadedCase:
    """What every kind of loaded, validated case file has: its path, its record, id and implementation."""
    path: Path
    record: dict

    @property
    def id(self) -> str:
        return self.record["id"]

    @property
    def implementation(self) -> str:
        return self.record["implementation"]


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_record(path: Path) -> dict:
    """A case file's JSON object; any problem is a ValueError naming the file: unreadable, corrupt
    or truncated JSON, something other than an object."""
    def bad(problem: str) -> ValueError:
        return ValueError(f"case file {path}: {problem}")

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise bad(f"cannot read it ({exc})") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                  f"the file is corrupt or truncated") from None
    except ValueError as exc:     # e.g. an integer of more digits than Python converts
        raise bad(f"not readable as JSON ({exc})") from None
    if not isinstance(record, dict):
        raise bad(f"must hold a JSON object (got {type(record).__name__})")
    return record


def read_header(path: Path | str, kind: str | None = None) -> tuple[dict, str]:
    """A case file's record and kind, whatever the kind: the JSON object (read_record), a
    ``schema_version`` this code reads for the file's ``kind`` (absent: :data:`UNMARKED_KIND`), and, where
    ``kind`` is given, that kind.  Any problem is a ValueError naming the file and the field."""
    path = Path(path)

    def bad(problem: str) -> ValueError:
        return ValueError(f"case file {path}: {problem}")

    record = read_record(path)
    found = record.get("kind", UNMARKED_KIND)
    if found not in KINDS:
        raise bad(f"kind={found!r}: must be one of {tuple(KINDS)}")
    if kind is not None and found != kind:
        raise bad(f"kind={found!r}: must be {kind!r} here")
    if "schema_version" not in record:
        raise bad("missing field 'schema_version'")
    version = record["schema_version"]
    if not is_int(version) or version < 1:
        raise bad(f"schema_version={version!r}: must be an int >= 1")
    if version > KINDS[found]:
        raise bad(f"schema_version={version}: newer than this rope-harness understands ({KINDS[found]}); "
                  f"upgrade rope-harness to replay it")
    return record, found


def case_kind(path: Path | str) -> str | None:
    """The kind of the case file at ``path``, or None for anything unreadable (the loader of the
    kind asked for then says what is wrong with it)."""
    try:
        return read_header(path)[1]
    except ValueError:
        return None


def read_fields(path: Path, kind: str, fields: tuple[str, ...], nullable: tuple[str, ...]):
    """The header (read_header), then what every kind's record holds: each of ``fields`` present,
    non-null unless ``nullable``, and ``id``, ``implementation``, ``created`` non-empty strings.
    Returns the record and the kind loader's ``bad(problem) -> ValueError`` naming the file."""
    def bad(problem: str) -> ValueError:
        return ValueError(f"case file {path}: {problem}")

    record, _ = read_header(path, kind)
    for name in fields:
        if name not in record:
            raise bad(f"missing field {name!r}")
        if record[name] is None and name not in nullable:
            raise bad(f"{name}=null: must have a value")
    for name in ("id", "implementation", "created"):
        if not isinstance(record[name], str) or not record[name]:
            raise bad(f"{name}={record[name]!r}: must be a non-empty string")
    return record, bad


def read_device(record: dict, bad) -> str:
    """The record's ``device``: one of rope.devices.DEVICE_NAMES (an index after a colon allowed)."""
    from rope.devices import DEVICE_NAMES
    device = record["device"]
    if not isinstance(device, str) or device.split(":", 1)[0] not in DEVICE_NAMES:
        raise bad(f"device={device!r}: must be one of {DEVICE_NAMES}")
    return device


# A kind's ``problems``: what its check found, as the failure said it (written clipped to these).
MAX_PROBLEMS = 20
MAX_PROBLEM_TEXT = 4000


def clipped_problems(problems) -> list[str]:
    """``problems`` as a record keeps them: at most MAX_PROBLEMS, each at most MAX_PROBLEM_TEXT long."""
    return [p[:MAX_PROBLEM_TEXT] for p in list(problems)[:MAX_PROBLEMS]]


def read_problems(record: dict, bad) -> list[str]:
    """The record's ``problems``: a list of at most MAX_PROBLEMS strings of at most MAX_PROBLEM_TEXT."""
    problems = record["problems"]
    if not isinstance(problems, list) or len(problems) > MAX_PROBLEMS or not all(
            isinstance(p, str) and len(p) <= MAX_PROBLEM_TEXT for p in problems):
        raise bad(f"problems: must be a list of at most {MAX_PROBLEMS} strings of at most {MAX_PROBLEM_TEXT} "
                  f"characters")
    return problems


def read_diagnosis(record: dict, bad, labels) -> dict:
    """The record's ``diagnosis``: an object whose ``label`` is one of the kind's ``labels``."""
    diagnosis = record["diagnosis"]
    if not isinstance(diagnosis, dict) or diagnosis.get("label") not in labels:
        raise bad(f"diagnosis: must be an object whose label is one of {tuple(labels)}")
    return diagnosis


def replay_params(loaded: LoadedCase, named: list[str]) -> list:
    """The pytest params replaying a loaded case file: one per implementation, the recorded one (a
    registered name only) or each one the user named (their word): ``(loaded, name, named?)``."""
    import pytest
    return [pytest.param((loaded, impl, bool(named)), id=f"{loaded.id}-{impl}") for impl in named or [loaded.implementation]]


# --------------------------------------------------------------------------- message
@contextlib.contextmanager
def replayed_call(name: str, case_id: str, *, own: tuple[type[BaseException], ...] = ()):
    """A replay's call of implementation ``name`` on case ``case_id``: a hang past the call deadline
    or a crash becomes the ValueError a replay reports as "cannot replay" (``rope-harness repro``
    exits 2).  ``own``: exception types the caller reports itself, let through unchanged."""
    from rope.harness.deadline import ImplementationHung
    try:
        yield
    except own:
        raise
    except ImplementationHung:
        raise ValueError(f"{name} did not return on case {case_id} within the call deadline "
                         f"($ROPE_CALL_TIMEOUT, default 120 s)") from None
    except Exception as exc:    # noqa: BLE001 - a crash of the implementation or a wrong return value
        raise ValueError(f"{name} failed on case {case_id} ({type(exc).__name__}: {exc})") from exc


def display_path(path: Path | str) -> str:
    """``path`` relative to the working directory when it lies below it, else absolute."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def replay_command(shown: str, implementation: str | None = None) -> str:
    """The command that replays the case file at ``shown``, as it must be typed: a replay runs a
    registered name it reads from the file, never a module path stored there, so an implementation
    named by import path (``package.module:callable``) is named again with ``--impl``.  Without
    ``implementation`` the file's own record says it (nothing where it cannot be read)."""
    if implementation is None:
        try:
            implementation = read_record(Path(shown)).get("implementation")
        except ValueError:
            implementation = None
    extra = f" --impl {implementation}" if isinstance(implementation, str) and ":" in implementation else ""
    return f"rope-harness repro {shown}{extra}"


def wrap(line: str, width: int = LINE_WIDTH) -> list[str]:
    """A long line of a message as lines of at most ``width`` (continuations indented); a word
    longer than that (a path) stays whole."""
    import textwrap
    if len(line) <= width:
        return [line]
    indent = " " * (len(line) - len(line.lstrip()) + 4)
    return textwrap.wrap(line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)


def case_paths(arguments: list[str]) -> list[Path]:
    """The case files a list of arguments names (``--rope-repro``): files as given; a directory
    expands to its ``*.json`` files, sorted (a ValueError when it holds none)."""
    out = []
    for arg in arguments:
        path = Path(arg)
        if path.is_dir():
            found = sorted(path.glob("*.json"))
            if not found:
                raise ValueError(f"--rope-repro={arg}: directory holds no *.json case files")
            out += found
        else:
            out.append(path)
    return out
