"""The worker contract: the check-in key; error files (the excepthook, chained; the @record
decorator; first error wins)."""
import json
import sys

import pytest

from accord import worker_contract


@pytest.fixture
def restore_hook():
    saved = sys.excepthook
    yield
    sys.excepthook = saved


def _raise(exc):
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_write_and_read_back(tmp_path):
    path = tmp_path / "sub" / "err.json"
    exc = _raise(ValueError("bad value"))
    assert worker_contract.write_error(exc, str(path)) == str(path)
    data = worker_contract.read_error_file(str(path))
    assert data["type"] == "ValueError" and data["message"] == "bad value"
    assert "Traceback" in data["traceback"] and "_raise" in data["traceback"]
    assert isinstance(data["timestamp"], float) and data["pid"] > 0
    assert worker_contract.write_error(_raise(KeyError("later")), str(path)) is None  # first one wins
    assert json.loads(path.read_text())["type"] == "ValueError"
    assert worker_contract.read_error_file(str(tmp_path / "missing")) is None


def test_install_chains_previous_hook_and_is_idempotent(tmp_path, monkeypatch, restore_hook):
    path = tmp_path / "e.json"
    monkeypatch.setenv("ACCORD_ERROR_FILE", str(path))
    seen = []
    sys.excepthook = lambda t, e, tb: seen.append(t)
    worker_contract.install()
    hook = sys.excepthook
    worker_contract.install()
    assert sys.excepthook is hook
    exc = _raise(RuntimeError("uncaught"))
    sys.excepthook(RuntimeError, exc, exc.__traceback__)
    assert seen == [RuntimeError]
    data = worker_contract.read_error_file(str(path))
    assert data["type"] == "RuntimeError" and "uncaught" in data["traceback"]


def test_hook_without_variable_writes_nothing(tmp_path, monkeypatch, restore_hook):
    monkeypatch.delenv("ACCORD_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    sys.excepthook = lambda *a: None
    worker_contract.install()
    exc = _raise(RuntimeError("x"))
    sys.excepthook(RuntimeError, exc, exc.__traceback__)
    assert list(tmp_path.iterdir()) == []


def test_record_decorator(tmp_path, monkeypatch):
    path = tmp_path / "e.json"
    monkeypatch.setenv("ACCORD_ERROR_FILE", str(path))

    @worker_contract.record
    def main(x):
        if x:
            raise KeyError("k")
        return 5

    assert main(0) == 5 and not path.exists()
    with pytest.raises(KeyError):
        main(1)
    assert worker_contract.read_error_file(str(path))["type"] == "KeyError"


def test_checkin_key_format():
    assert worker_contract.CHECKIN_KEY.format(rank=3) == "accord/checkin/3"
