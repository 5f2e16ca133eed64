"""Writing a benchmark's result: the JSON file, with the command that produced it and the date.

Shared by the scripts in this folder (run as ``python benchmarks/<script>.py``, so this folder
is on the import path).
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Sequence


def record(result: dict[str, Any], path: str, script: str, argv: Sequence[str] | None) -> None:
    """Add ``command`` (``python benchmarks/<script> <args>``) and ``date`` to ``result`` and
    write it to ``path`` as indented JSON, creating the folder if needed."""
    args = list(sys.argv[1:] if argv is None else argv)
    result["command"] = " ".join(["python", f"benchmarks/{script}", *args]).rstrip()
    result["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(result, fh, indent=2)
