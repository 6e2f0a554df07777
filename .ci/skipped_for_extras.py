"""The node ids of the tests that a run skipped for want of one of the project's extras.

CI runs the suite first with the core dependencies alone, where every test that needs transformers
(the ``oracle`` extra) or Liger (``backends``) must skip and say what to install; then it installs
the extras and runs exactly those tests.  Reads the first run's JUnit XML; prints one node id a line.

    python .ci/skipped_for_extras.py core.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

# What the skip reasons of a missing extra name (rope/backends adapters, the plugin's oracle marker,
# the position-id implementations' parametrization).
EXTRA_PACKAGES = ("transformers", "liger", "[oracle]", "[backends]")
NONE_INSTALLED = ("none-", "none]")


def skipped_for_extras(path: str) -> list[str]:
    ids = []
    for case in ET.parse(path).getroot().iter("testcase"):
        skipped = case.find("skipped")
        if skipped is None:
            continue
        reason = (skipped.get("message") or "") + (skipped.text or "")
        if not any(name in reason.lower() for name in EXTRA_PACKAGES):
            continue
        module = case.get("classname", "")
        if not module:          # a module skipped whole at import: name "properties.test_x"
            ids.append(case.get("name", "").replace(".", "/") + ".py")
            continue
        parts = module.split(".")
        # classname "properties.rotation.test_rotation" (a function) or "properties.test_x.TestClass" (a method)
        for split in range(len(parts), 0, -1):
            if parts[split - 1].startswith("test_"):
                path_part = "/".join(parts[:split]) + ".py"
                name = case.get("name", "")
                # The plugin's placeholder where no position-id implementation is installed
                # ("none"): with the extra its parameters are the implementations, so the whole test.
                if name.split("[", 1)[-1].startswith(NONE_INSTALLED):
                    name = name.split("[", 1)[0]
                ids.append("::".join([path_part, *parts[split:], name]))
                break
    return sorted(set(ids))


if __name__ == "__main__":
    ids = skipped_for_extras(sys.argv[1])
    if not ids:
        sys.exit("skipped_for_extras: no test skipped for a missing extra: the core run is not what CI expects")
    print("\n".join(ids))
