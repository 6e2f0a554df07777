"""``python -m rope.harness.mutation``: ``rope-harness mutants`` (rope.harness.mutation.cli)."""

import sys

from rope.harness.mutation.cli import main

sys.exit(main())
