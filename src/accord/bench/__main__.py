"""``python -m accord.bench collectives|train``: see :mod:`accord.bench.cli`."""
from __future__ import annotations

import sys

from accord.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
