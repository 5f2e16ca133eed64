"""``python -m accord.run``: the same as ``accordrun``."""
import sys

from accord.run.cli import main

sys.exit(main())
