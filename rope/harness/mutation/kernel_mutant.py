"""Kernel mutants: a kernel module rebuilt with small textual substitutions, the machinery of the
suite's known Triton-kernel bugs (properties/mutants/kernel.py holds the bugs themselves).

A :class:`KernelMutant` is the source of a kernel's modules (for the rotation, ``rope/triton/rotary_kernel.py``,
its launch plan ``rotary_plan.py`` and its entry points ``rotary.py``; for the position step
``rope/triton/positions.py``) with substitutions applied, executed as fresh modules under unique names:
the mutant's entry points launch the mutant's kernel with the mutant's plan.  Every substitution must
match the current sources exactly once (in one of the files), or building the mutant raises
:class:`SubstitutionError`: a mutant never silently stops applying when the kernel changes.

Each patched source is registered with ``linecache`` under a ``<mutant ...>`` file name, because
Triton (interpreter and compiler alike) reads a kernel's source with ``inspect.getsourcelines``.

A mutant is callable with the implementation's signature (the mutant module's ``rotate_triton`` or
``prepare_positions_triton``), carries its bug's docstring, ``working_precision`` and ``supports``,
so it also resolves through the registry (``--rope-impl properties.mutants.kernel:neox_for_gptj``).
"""

from __future__ import annotations

import functools
import importlib.util
import linecache
import pathlib
import sys
import types

from rope.implementation import Implementation
import rope.triton.positions as positions_module
import rope.triton.rotary as rotary_module
import rope.triton.rotary_kernel as rotary_kernel_module
import rope.triton.rotary_plan as rotary_plan_module

# The modules an entry module is built from, in import order, that a mutant of it rebuilds with it:
# a substitution may fall in any of them (the kernel, its plan), and the mutant's entry points must
# launch the mutant's kernel with the mutant's plan.
PARTS = {rotary_module.__name__: (rotary_kernel_module, rotary_plan_module)}


# Values a module's re-execution makes equal, not the same (never rebound: equal is enough).
_CONSTANTS = (int, float, complex, str, bytes, tuple, frozenset, type(None))


class SubstitutionError(RuntimeError):
    """A mutant's substitution no longer matches its kernel source exactly once."""


class KernelMutant:
    """A kernel module with substitutions applied; calling it calls the mutant's ``entry``.

    ``module`` is the entry's module; the files patched are those of ``parts`` (default: the
    modules it is built from, ``PARTS``) and its own, each substitution in whichever one it matches."""

    def __init__(self, name: str, module, entry: str, substitutions, doc: str, parts=None):
        self.name = name
        self.module_name = module.__name__
        self.parts = (*(PARTS.get(module.__name__, ()) if parts is None else parts), module)
        self.paths = tuple(pathlib.Path(part.__file__) for part in self.parts)
        self.entry = entry
        self.substitutions = tuple(substitutions)
        self.__doc__ = doc
        self.__name__ = name
        self.__qualname__ = name
        declared = Implementation.of(entry, getattr(module, entry))     # what the unmutated entry declares
        self.working_precision = declared.working_precision
        self.supports = declared.supports

    @property
    def path(self) -> pathlib.Path:
        """The file the first substitution applies to (the entry's module's where none applies)."""
        old = self.substitutions[0][0] if self.substitutions else None
        return next((path for path in self.paths if old is not None and old in path.read_text()), self.paths[-1])

    def sources(self) -> tuple[str, ...]:
        """The patched source of each file of ``paths``; raises SubstitutionError unless every
        substitution matches exactly once in them all."""
        texts = [path.read_text() for path in self.paths]
        for old, new in self.substitutions:
            counts = [text.count(old) for text in texts]
            if sum(counts) != 1:
                names = " + ".join(path.name for path in self.paths)
                raise SubstitutionError(f"mutant {self.name}: substitution must match {names} exactly "
                                        f"once (matched {sum(counts)} times): {old!r}")
            i = counts.index(1)
            texts[i] = texts[i].replace(old, new)
        return tuple(texts)

    def source(self) -> str:
        """The patched sources of the files the substitutions change, in the order of ``paths`` (one
        file, ``path``, for every mutant but cos_sin_unmasked_head_padded).  Raises SubstitutionError
        as ``sources`` does."""
        return "".join(text for text, path in zip(self.sources(), self.paths) if text != path.read_text())

    @functools.cached_property
    def module(self) -> types.ModuleType:
        """The entry's module, patched; the parts before it are patched and loaded first, and every
        name a later one bound to an object of an earlier part is bound to the patched part's."""
        replaced: dict[int, object] = {}
        for part, path, text in zip(self.parts, self.paths, self.sources()):
            unique = f"{part.__name__}__mutant_{self.name}"
            filename = f"<mutant {self.name} of {path.name}>"
            linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
            spec = importlib.util.spec_from_loader(unique, loader=None, origin=filename)
            module = importlib.util.module_from_spec(spec)
            module.__file__ = filename
            sys.modules[unique] = module
            exec(compile(text, filename, "exec"), module.__dict__)
            for key, value in list(module.__dict__.items()):
                if id(value) in replaced and not key.startswith("__"):
                    module.__dict__[key] = replaced[id(value)]
            # What a later part may have imported from this one: the module, and each object that
            # executing it made anew (functions, kernels, caches; not what it imported, nor constants).
            replaced[id(part)] = module
            for key, value in vars(part).items():
                patched = module.__dict__.get(key, value)
                if patched is not value and not isinstance(value, _CONSTANTS):
                    replaced[id(value)] = patched
        return module

    @property
    def implementation(self):
        return getattr(self.module, self.entry)

    def __call__(self, *args, **kwargs):
        return self.implementation(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<kernel mutant {self.name} of {self.path.name}>"


def rotary_mutant(*substitutions):
    """A decorator: the rotation kernel with ``substitutions`` (``(old, new)`` pairs), as a mutant named
    and documented by the decorated function."""
    def make(fn) -> KernelMutant:
        return KernelMutant(fn.__name__, rotary_module, "rotate_triton", substitutions, fn.__doc__)
    return make


def positions_mutant(*substitutions):
    """A decorator: the position-step kernel with ``substitutions``, as a mutant named and documented
    by the decorated function."""
    def make(fn) -> KernelMutant:
        return KernelMutant(fn.__name__, positions_module, "prepare_positions_triton", substitutions, fn.__doc__)
    return make
