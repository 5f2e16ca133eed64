"""The framework integrations are imported only when asked for: ``import accord`` and
``import accord.torch`` load neither Lightning nor Accelerate, and ``import accord.lightning``
without Lightning fails with an ImportError that names the pip line (checked in a fresh
interpreter, where Lightning is made unimportable if it is installed)."""
import json
import subprocess
import sys

import pytest

FRAMEWORKS = ("pytorch_lightning", "lightning", "lightning_fabric", "lightning_utilities", "accelerate")

PROBE = f"""
import json, sys
import accord, accord.torch
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {FRAMEWORKS!r})
for name in ("pytorch_lightning", "lightning"):
    sys.modules[name] = None  # as if not installed
try:
    import accord.lightning
    error = None
except ImportError as exc:
    error = str(exc)
print(json.dumps({{"loaded": loaded, "error": error}}))
"""


@pytest.mark.timeout(120)
def test_frameworks_load_only_with_their_integration():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["loaded"] == []
    assert result["error"] is not None
    assert "accord.lightning needs PyTorch Lightning 2.6" in result["error"]
    assert "HINT: pip install 'accord[lightning]'" in result["error"]
