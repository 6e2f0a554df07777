"""Print line N (1-based) of the README's first ```bash block: the two commands the README opens
with (set everything up and check; run the tests), which CI runs as they are written."""

import re
import sys
from pathlib import Path

text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
block = re.search(r"^```bash\n(.*?)^```$", text, re.M | re.S)
lines = [line for line in block.group(1).splitlines() if line.strip()] if block else []
n = int(sys.argv[1])
if not 1 <= n <= len(lines):
    sys.exit(f"README.md: the first bash block has {len(lines)} commands, not {n}")
print(lines[n - 1])
