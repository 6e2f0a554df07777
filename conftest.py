"""A shim for running the suite from this checkout.

The harness's pytest plugin is ``rope.harness.plugin``, loaded through the package's ``pytest11``
entry point once the project is installed (``pip install -e .`` here, ``pip install rope-harness``
anywhere).  Without that (the checkout on PYTHONPATH, or PYTEST_DISABLE_PLUGIN_AUTOLOAD set), load
it from here; never both, which pytest would refuse as a double registration.
"""

import os
from importlib import metadata

_PLUGIN = "rope.harness.plugin"
if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") or not any(
        entry.value == _PLUGIN for entry in metadata.entry_points(group="pytest11")):
    pytest_plugins = [_PLUGIN]
