"""Where a run writes its report and case files: ``$ROPE_REPORTS_DIR``, else ``./reports`` of the
working directory (never the installed package)."""

from __future__ import annotations

import os
from pathlib import Path

REPORTS_DIR_ENV = "ROPE_REPORTS_DIR"


def reports_dir() -> Path:
    return Path(os.environ.get(REPORTS_DIR_ENV) or Path.cwd() / "reports")
