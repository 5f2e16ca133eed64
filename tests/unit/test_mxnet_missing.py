"""Without MXNet (the main .venv), accord.mxnet fails at import with the install HINT."""
import importlib
import sys

import pytest


def test_import_without_mxnet_names_the_extra(monkeypatch):
    try:
        import mxnet

        mxnet.nd.NDArray  # noqa: B018
    except Exception:
        pass
    else:
        pytest.skip("MXNet is installed here; this checks the error where it is not")
    for name in [m for m in sys.modules if m == "accord.mxnet" or m.startswith("accord.mxnet.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError) as info:
        importlib.import_module("accord.mxnet")
    text = str(info.value)
    assert "accord.mxnet needs MXNet 1.9.1" in text and "HINT: pip install 'accord[mxnet]'" in text
