"""docs/troubleshooting.md names every exception class of src/accord (read with ``ast``: nothing is
imported), and quotes the stall inspector's messages as the code writes them."""
from __future__ import annotations

import ast
import builtins
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src", "accord")
PAGE = os.path.join(ROOT, "docs", "troubleshooting.md")

pytestmark = pytest.mark.timeout(60)


def exception_classes() -> dict[str, str]:
    """Every class of src/accord that derives (through any of them) from BaseException: name -> file."""
    bases: dict[str, tuple[list[str], str]] = {}
    for folder, _, files in os.walk(SRC):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as fh:
                    tree = ast.parse(fh.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.ClassDef):
                        names = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
                        bases[node.name] = (names, os.path.relpath(path, ROOT))

    def is_exception(name: str, seen: frozenset = frozenset()) -> bool:
        builtin = getattr(builtins, name, None)
        if isinstance(builtin, type) and issubclass(builtin, BaseException):
            return True
        if name in seen or name not in bases:
            return False
        return any(is_exception(b, seen | {name}) for b in bases[name][0])

    return {name: where for name, (parents, where) in bases.items() if is_exception(name)}


def test_every_exception_class_is_on_the_troubleshooting_page():
    classes = exception_classes()
    assert {"AccordError", "StallError", "MismatchError", "HostsUpdatedInterrupt"} <= set(classes)
    assert len(classes) >= 20, classes
    with open(PAGE, encoding="utf-8") as fh:
        page = fh.read()
    missing = {name: where for name, where in classes.items() if f"`{name}`" not in page}
    assert missing == {}


def test_the_stall_messages_on_the_page_are_the_inspectors(caplog):
    """The page quotes the warning StallInspector logs and the StallError it raises, word for word
    (with the defaults: a check after 60 s, a shutdown after 1800 s)."""
    from accord import config
    from accord.engine.cycle.stall import StallInspector
    from accord.engine.negotiation.negotiate import Partial

    assert config.VARIABLES["ACCORD_STALL_CHECK_TIME_SECONDS"].default == 60.0
    with open(PAGE, encoding="utf-8") as fh:
        page = fh.read()

    def stalled(age: float) -> list[Partial]:
        return [Partial(name="allreduce.loss", process_set=0, present=(0,), missing=(1,), age=age)]

    with caplog.at_level("WARNING", logger="accord.engine"):
        assert StallInspector(check_time=60.0, shutdown_time=1800.0).review(stalled(61.2), now=1000.0) is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "accord.engine"]
    assert len(warnings) == 1 and warnings[0] in page, warnings
    error = StallInspector(check_time=60.0, shutdown_time=1800.0).review(stalled(1800.0), now=5000.0)
    assert error is not None and type(error).__name__ == "StallError"
    assert str(error) in page, str(error)
