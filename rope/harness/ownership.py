"""Are ``rope``, ``reference`` and ``properties`` this project's packages?

The three names are taken on PyPI too (``rope`` is a popular refactoring library, which python-lsp
pulls in).  Installed beside rope-harness, another distribution's package shadows ours or overwrites
files of it, and the harness would mix both silently (a foreign ``rope/__init__.py`` never throws
the Triton interpreter switch, say).  Each of our packages carries ``__rope_harness__ = True``;
:func:`check_own_packages` finds each package without importing the suite, reads the marker from
its ``__init__.py`` and raises ImportError naming the other distribution and what to do.  A
distribution installed under one of our package names (PyPI's ``rope``) is refused even where our
``__init__.py`` won (it overwrote theirs): both are broken, only silently.  ``rope/__init__.py``
makes the same by-name check for ``rope``, so the other library's users meet the message too.
"""

from __future__ import annotations

import importlib.util
from importlib import metadata

OWN_DISTRIBUTION = "rope-harness"
PACKAGES = ("rope", "reference", "properties")
MARKER = "__rope_harness__ = True"


def _other_distributions(package: str) -> list[str]:
    try:
        owners = metadata.packages_distributions().get(package, [])
    except Exception:   # noqa: BLE001 - broken metadata must not hide the real message
        owners = []
    return sorted({name for name in owners if name.lower().replace("_", "-") != OWN_DISTRIBUTION})


def foreign_packages() -> list[str]:
    """One problem per package that is not this project's, with where it lives and who owns it."""
    problems = []
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        origin = getattr(spec, "origin", None) if spec is not None else None
        if origin is None:
            problems.append(f"{package!r} is not importable (rope-harness is not installed completely)")
            continue
        try:
            ours = MARKER in open(origin, encoding="utf-8").read()
        except OSError:
            ours = False
        if not ours:
            others = _other_distributions(package)
            who = f"the distribution {', '.join(others)}" if others else "another package"
            problems.append(f"{package!r} at {origin} belongs to {who}, not to rope-harness")
    return problems


def sharing_distributions() -> list[str]:
    """One problem per distribution installed in this environment under the name of one of our
    packages (PyPI's ``rope``, the refactoring library): it installs files into the same import
    package, so whichever was installed second overwrote the first's ``__init__.py`` and uninstalling
    either deletes it from the other, while ``pip check`` says nothing.  A lookup by name, cheap
    enough for every import."""
    problems = []
    for package in PACKAGES:
        try:
            other = metadata.distribution(package)
        except metadata.PackageNotFoundError:
            continue
        except Exception:   # noqa: BLE001 - broken metadata must not hide the real message
            continue
        problems.append(f"the distribution {other.metadata.get('Name', package)} {other.version} is installed too "
                        f"and owns the import package {package!r} as rope-harness does (installing one overwrites "
                        f"the other's files, uninstalling one deletes them from the other)")
    return problems


def check_own_packages() -> None:
    """Raise ImportError when another distribution shadows, overwrote or shares one of our packages."""
    problems = sharing_distributions() + foreign_packages()
    if problems:
        raise ImportError(
            "rope-harness cannot run here: " + "; ".join(problems) + ". Its packages share these names with "
            "other projects on PyPI (rope is also the refactoring library that python-lsp installs). Use a "
            "virtual environment of its own for rope-harness (python3 -m venv .venv && .venv/bin/pip install "
            "rope-harness), or uninstall both (pip uninstall rope rope-harness) and reinstall the one you need "
            "(pip install --force-reinstall), since each may have overwritten files of the other.")
