"""cos/sin tables shared by the test processes of one host.

A campaign's workers draw the same tables (a base and a rotary width, up to 131,072 rows: 128 MiB
and tens of milliseconds to build each) and, each with its own memo, built every one of them once
per worker: 16 workers, 16 builds of the same bits.  With ``$ROPE_TABLE_STORE`` naming a directory
(``rope-harness campaign`` makes one per campaign and removes it at its end), the first process to
build a float32 table writes it there (to a temporary name, then renamed: no process ever maps a
partial file; not fsynced, as nothing outlives the campaign) and the others map the file instead of
building (``torch.from_file``: the pages come from the page cache, shared between the
processes, and are read only where a case reads them).

The store holds only what this host's processes wrote into a directory made for them; a file whose
size is not the table's is ignored (and rebuilt in memory).  A write that fails (a full disk) is
dropped, and writing stops, without an error, once the directory holds ``$ROPE_TABLE_STORE_LIMIT``
bytes (default 8 GiB): a campaign draws more distinct tables than are worth keeping on disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import torch

STORE_ENV = "ROPE_TABLE_STORE"
LIMIT_ENV = "ROPE_TABLE_STORE_LIMIT"
DEFAULT_LIMIT = 8 << 30


def store_dir() -> Path | None:
    """The store's directory, or None when no store is set (every process builds its own tables)."""
    raw = os.environ.get(STORE_ENV, "").strip()
    return Path(raw) if raw else None


def _limit() -> int:
    raw = os.environ.get(LIMIT_ENV, "").strip()
    if not raw:
        return DEFAULT_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        raise ValueError(f"{LIMIT_ENV}={raw!r}: must be a whole number of bytes") from None
    if limit < 0:
        raise ValueError(f"{LIMIT_ENV}={raw!r}: must be >= 0")
    return limit


def _path(root: Path, base: float, width: int, rows: int) -> Path:
    # What the table depends on, hashed: a file name of fixed characters for any base.
    return root / (hashlib.sha256(repr((float(base), width, rows)).encode()).hexdigest()[:32] + ".f32")


def load(base: float, width: int, rows: int) -> torch.Tensor | None:
    """The float32 [rows, width] table of ``base`` from the store, mapped from its file; None when
    there is no store, no such file, or a file of another size."""
    root = store_dir()
    if root is None:
        return None
    path = _path(root, base, width, rows)
    try:
        size = path.stat().st_size
    except OSError:
        return None
    if size != rows * width * 4 or not rows * width:
        return None
    return torch.from_file(str(path), shared=False, size=rows * width, dtype=torch.float32).view(rows, width)


def save(base: float, table: torch.Tensor) -> None:
    """Write the float32 [rows, width] ``table`` of ``base`` for the other processes, unless there is
    no store, it is there already, or the store holds its limit."""
    root = store_dir()
    if root is None or table.dtype != torch.float32 or not table.numel():
        return
    rows, width = table.shape
    path = _path(root, base, width, rows)
    if path.exists():
        return
    nbytes = table.numel() * 4
    try:
        held = sum(entry.stat().st_size for entry in os.scandir(root) if entry.name.endswith(".f32"))
    except OSError:
        return
    if held + nbytes > _limit():
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".", suffix=".tmp")
    except OSError:            # the directory is gone (the campaign ended) or not writable
        return
    try:
        with os.fdopen(fd, "wb") as f:
            table.contiguous().numpy().tofile(f)
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if not isinstance(error, OSError):     # a full disk only means the others build it too
            raise


def make_store() -> Path:
    """A new, private store directory: in shared memory (/dev/shm) where there is one, else in the
    temporary directory.  The caller removes it (:func:`remove_store`)."""
    shm = Path("/dev/shm")
    parent = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="rope-tables-", dir=parent))


def remove_store(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
