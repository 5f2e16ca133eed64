"""Skip MXNet tests, with the reason, where MXNet 1.9.1 cannot be imported.

scripts/test.sh runs tests/with_mxnet a second time in .venv-mxnet (MXNet 1.9.1 needs numpy 1.23.5,
which must not reach the main .venv); in the main .venv these tests are skipped with this reason.
"""
from __future__ import annotations

import pytest


def require_mxnet() -> None:
    """Skip the calling test module unless ``import mxnet`` works."""
    try:
        import mxnet

        mxnet.nd.NDArray  # noqa: B018  (a folder named mxnet on sys.path would import as a namespace)
    except Exception as exc:  # numpy >= 1.24 breaks MXNet 1.9.1 with AttributeError, not ImportError
        pytest.skip(f"MXNet 1.9.1 is not importable here ({type(exc).__name__}: {str(exc)[:80]}); "
                    "scripts/test.sh runs tests/with_mxnet in .venv-mxnet, which scripts/setup_env.sh "
                    "builds (pip install 'accord[mxnet]')", allow_module_level=True)
