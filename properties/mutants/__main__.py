"""``python -m properties.mutants``: the mutant catalogue as JSON on stdout (properties/mutants/catalogue.py)."""

import sys

from properties.mutants.catalogue import main

if __name__ == "__main__":
    sys.exit(main())
