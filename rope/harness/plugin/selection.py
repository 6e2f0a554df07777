"""What a run checks: the devices and GPUs (--rope-device), the implementations of each checked
thing (--rope-impl, --rope-position-step-impl, --rope-position-ids-impl), and the replays alone under
--rope-repro."""

from __future__ import annotations

from pathlib import Path

import pytest

from rope.harness.plugin.activation import is_rope_test


def keep_harness_stages_out(config, items):
    """The tests marked ``harness_stage`` run when a rope-harness command asks for them, not in a plain
    run of the suite (they take no implementation of the user's): the replays with --rope-repro, the
    serving-engine-style baseline with --rope-baseline, the guarded searches of the kernel mutants with
    --rope-mutant-search (any of them runs when the command line names its file)."""
    named = {Path(str(a).split("::", 1)[0]).name for a in config.args}
    def asked(item) -> bool:
        if item.get_closest_marker("harness_stage") is None or item.path.name in named:
            return True
        if item.get_closest_marker("baseline") is not None:
            return bool(config.getoption("--rope-baseline"))
        if item.get_closest_marker("mutant_search") is not None:
            return bool(config.getoption("--rope-mutant-search"))
        return item.get_closest_marker("replay") is not None and bool(config.getoption("--rope-repro"))
    keep = [item for item in items if asked(item)]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if not asked(item)])
        items[:] = keep


def keep_only_asked_mutant_searches(config, items):
    """With --rope-mutant-search NAME, the tests marked ``mutant_search`` of other mutants are
    deselected (``all`` keeps every one); the other tests are left to the rest of the selection."""
    asked = config.getoption("--rope-mutant-search")
    if not asked or "all" in asked:
        return

    def other(item) -> bool:
        marker = item.get_closest_marker("mutant_search")
        return marker is not None and marker.args[0] not in asked
    dropped = [item for item in items if other(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not other(item)]


def keep_only_replays(config, items):
    """With --rope-repro, run the replays only (the tests marked ``replay``: each checked thing's
    test_replay.py)."""
    if not config.getoption("--rope-repro"):
        return
    keep = [item for item in items if item.get_closest_marker("replay") is not None]
    config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("replay") is None])
    items[:] = keep


GPU_KINDS = ("cuda", "rocm", "xpu")


def keep_cpu_work_off_gpu_runs(config, items):
    """On a run that checks a GPU, the tests marked ``needs_no_gpu`` (the CPU bench, the offline
    compile sweeps, the documents' commands: minutes of CPU work that a GPU box runs no faster) are
    deselected unless --rope-cpu-work asks for them; CPU CI runs them.  So are the tests' CPU
    parametrizations (``device`` = ``cpu``) where the devices were found, not named: the CPU's checks
    are CPU CI's, and ``--rope-device cpu`` (beside the GPU's) or --rope-cpu-work asks for them on a
    GPU box.  The report header says so."""
    if not cpu_work_left_out(config):
        return
    named_cpu = "cpu" in [label.partition(":")[0] for label in (config.getoption("--rope-device") or [])]

    def cpu_work(item) -> bool:
        if item.get_closest_marker("needs_no_gpu") is not None:
            return True
        params = getattr(getattr(item, "callspec", None), "params", {})
        return not named_cpu and params.get("device") == "cpu"
    dropped = [item for item in items if cpu_work(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not cpu_work(item)]


def cpu_work_left_out(config) -> bool:
    """Whether this run leaves the ``needs_no_gpu`` tests out: it checks a GPU and was not given
    --rope-cpu-work."""
    return not config.getoption("--rope-cpu-work") and any(
        kind in GPU_KINDS for kind in selected_devices(config))


# The parameter a test takes its implementation under, and the built-in implementations of it.
def _builtins_by_parameter() -> dict:
    from rope.registry import BUILTIN_POSITIONS, BUILTIN_ROTATIONS
    return {"impl_name": BUILTIN_ROTATIONS, "positions_impl_name": BUILTIN_POSITIONS}


def keep_builtins_only_for_builtins(config, items):
    """The tests marked ``builtins_only`` hold the built-in implementations to what only they promise
    (the harness's own validation messages: rope.harness.draws.skip_unless_builtin): for any other
    implementation (``--rope-impl mypkg.rope:fn``) they are deselected, not skipped, so its run counts
    and reports only what it is checked for."""
    builtins = _builtins_by_parameter()

    def meant_for_another(item) -> bool:
        if item.get_closest_marker("builtins_only") is None:
            return False
        params = getattr(getattr(item, "callspec", None), "params", {})
        return any(name in params and params[name] not in names for name, names in builtins.items())
    dropped = [item for item in items if meant_for_another(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not meant_for_another(item)]


def selected_devices(config) -> list[str]:
    """The device kinds to run on (cpu, cuda, rocm, xpu); ``--rope-device cuda:1`` selects the kind
    and, through :func:`selected_gpus`, that GPU."""
    from rope.devices import available_devices
    from rope.harness import placement
    found = available_devices()
    wanted = []
    for label in config.getoption("--rope-device") or found:
        try:
            kind, index = placement.parse_device(label)
        except ValueError as exc:
            raise pytest.UsageError(f"--rope-device: {exc}") from None
        if kind not in found:
            raise pytest.UsageError(f"--rope-device={label!r}: not available here (found {found})")
        if index is not None and index >= placement.gpu_count(kind):
            raise pytest.UsageError(f"--rope-device={label!r}: only {placement.gpu_count(kind)} {kind} GPU(s) visible")
        wanted.append(kind)
    return list(dict.fromkeys(wanted))


def selected_gpus(config, kind: str) -> list[int]:
    """The GPUs of ``kind`` tests are spread over: those named (``--rope-device cuda:1``), else all visible."""
    from rope.harness import placement
    named = [placement.parse_device(label) for label in config.getoption("--rope-device")]
    indices = [i for k, i in named if k == kind and i is not None]
    if indices and any(k == kind and i is None for k, i in named):
        indices = []     # plain "cuda" beside "cuda:1" means every GPU
    return list(dict.fromkeys(indices)) or list(range(max(1, placement.gpu_count(kind))))


def device_params(config, combos: list[tuple], ids: list[str]) -> list:
    """pytest params for (..., device) combos: a GPU device becomes one param per selected GPU
    (``cuda:0``, ``cuda:1``, ...), marked ``rope_gpu``; collection keeps one of them per test
    (:func:`keep_one_gpu_per_test`)."""
    params = []
    for combo, name in zip(combos, ids):
        kind = combo[-1]
        if kind == "cpu":
            params.append(pytest.param(*combo, id=name))
            continue
        for index in selected_gpus(config, kind):
            params.append(pytest.param(*combo, id=f"{name}:{index}", marks=pytest.mark.rope_gpu(kind, index)))
    return params


def _selected(config, option: str, builtins, resolve) -> dict:
    """The implementations named by a repeatable option (names or module:callable), else all built-ins."""
    names = config.getoption(option)
    if not names:
        return builtins()
    try:
        return {name: resolve(name) for name in names}
    except ValueError as exc:
        raise pytest.UsageError(f"{option}: {exc}") from None


def selected_implementations(config) -> dict:
    from rope.registry import get_implementation, implementations
    return _selected(config, "--rope-impl", implementations, get_implementation)


def selected_positions_implementations(config) -> dict:
    from rope.registry import get_positions_implementation, positions_implementations
    return _selected(config, "--rope-position-step-impl", positions_implementations, get_positions_implementation)


def selected_position_ids_implementations(config) -> dict:
    from rope.harness.position_ids.implementations import get_position_ids_implementation, position_ids_implementations
    return _selected(config, "--rope-position-ids-impl", position_ids_implementations, get_position_ids_implementation)


def selected_table_implementations(config) -> dict:
    from rope.registry import get_table_implementation, table_implementations
    return _selected(config, "--rope-table-impl", table_implementations, get_table_implementation)


def selected_fused_implementations(config) -> dict:
    from rope.registry import fused_implementations, get_fused_implementation
    return _selected(config, "--rope-fused-impl", fused_implementations, get_fused_implementation)


def skip_oracle_tests_without_transformers(items) -> None:
    """Tests marked ``oracle`` compare against transformers: where it is not installed (the
    ``oracle`` extra is optional) they skip and say what to install, whatever they import first."""
    import importlib.util
    if importlib.util.find_spec("transformers") is not None:
        return
    skip = pytest.mark.skip(reason="transformers not installed: pip install 'rope-harness[oracle]'")
    for item in items:
        if is_rope_test(item) and item.get_closest_marker("oracle") is not None:
            item.add_marker(skip)
