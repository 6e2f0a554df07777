"""The host's table store: a cos/sin table built by one test process is mapped by the others, bit
for bit, and nothing else is ever taken from it."""

from __future__ import annotations

import pytest
import torch

from rope.cache import cos_sin_cache
from rope.harness import profiling, table_store
from rope.harness.rotation import cases as inputs
from rope.spec import RopeSpec


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(table_store.STORE_ENV, str(tmp_path))
    monkeypatch.delenv(table_store.LIMIT_ENV, raising=False)
    profiling.reset()
    yield tmp_path
    profiling.reset()


def _counts():
    return profiling.snapshot()["counts"]


@pytest.mark.parametrize("base, width, rows", [(10000.0, 128, 4096), (1e6, 80, 300), (123456.789, 6, 7)])
def test_a_table_built_once_is_mapped_by_the_next_process(store, base, width, rows):
    # What a second worker does: its memo is empty, the store has the first worker's table.
    built = inputs._float32_table(base, width, rows)
    assert _counts().get("table_builds") == 1 and len(list(store.glob("*.f32"))) == 1
    mapped = inputs._float32_table(base, width, rows)
    assert _counts().get("table_builds") == 1 and _counts().get("table_loads") == 1
    expected = cos_sin_cache(RopeSpec(width, width, base=base, max_position=rows))
    assert mapped.shape == (rows, width) and torch.equal(mapped, expected) and torch.equal(built, expected)


def test_a_stored_file_of_another_size_is_ignored(store):
    table_store.save(10000.0, torch.zeros(300, 64))
    assert table_store.load(10000.0, 64, 300) is not None
    path, = store.glob("*.f32")
    path.write_bytes(path.read_bytes()[:-4])           # cut short: not this table
    assert table_store.load(10000.0, 64, 300) is None
    assert table_store.load(10000.0, 64, 301) is None       # another table: no file


def test_the_store_stops_writing_at_its_limit_and_without_a_store_nothing_is_written(store, monkeypatch):
    monkeypatch.setenv(table_store.LIMIT_ENV, str(300 * 64 * 4))
    table_store.save(1.0, torch.zeros(300, 64))
    table_store.save(2.0, torch.zeros(300, 64))     # would pass the limit
    assert len(list(store.glob("*.f32"))) == 1
    monkeypatch.delenv(table_store.STORE_ENV)
    assert table_store.store_dir() is None and table_store.load(1.0, 64, 300) is None


@pytest.mark.parametrize("raw", ["lots", "-1", "1.5"])
def test_a_bad_limit_is_refused_naming_the_variable(store, monkeypatch, raw):
    monkeypatch.setenv(table_store.LIMIT_ENV, raw)
    with pytest.raises(ValueError, match=table_store.LIMIT_ENV):
        table_store.save(1.0, torch.zeros(300, 64))


def test_a_store_is_private_and_removed_whole():
    root = table_store.make_store()
    try:
        assert root.is_dir() and (root.stat().st_mode & 0o077) == 0        # mkdtemp: the owner's alone
        (root / "x.f32").write_bytes(b"0000")
    finally:
        table_store.remove_store(root)
    assert not root.exists()


def test_a_store_that_cannot_take_a_table_is_no_error(store, monkeypatch):
    # A full disk, or the campaign's directory removed under a worker: the table is built all the same.
    import os
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", full)
    table_store.save(1.0, torch.zeros(300, 64))
    assert not list(store.iterdir())                    # the temporary file cleaned up
    monkeypatch.undo()
    monkeypatch.setenv(table_store.STORE_ENV, str(store / "gone"))
    assert torch.equal(inputs._float32_table(10000.0, 8, 7), cos_sin_cache(RopeSpec(8, 8, max_position=7)))
