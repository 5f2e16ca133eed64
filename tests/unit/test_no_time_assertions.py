"""No test asserts an upper bound on wall-clock time: on a busy CI machine anything takes longer,
and such an assertion fails a test whose code is right. A test bounds its waits instead (the
harness's ``timeout=``, a subprocess timeout, ``pytest.mark.timeout``) and asserts behaviour:
the message of the fast path, a marker a process that was not stopped would leave. A lower bound
(``seconds >= 4.0`` for a 5 s timeout) stays allowed: load can only make the time longer.

The scan reads every ``tests/**/*.py`` with :mod:`ast`: an ``assert`` whose test compares,
with ``<``/``<=`` (or ``>``/``>=`` from the number's side), a timing expression to a number. A
timing expression names an identifier like ``elapsed``, ``took``, ``seconds``, ``duration``,
``wall``, ``waited``, ``*_s`` or ``*_ms`` (a name, an attribute or a subscript key) or calls a clock
(``time.monotonic()``, ``time.time()``, ``perf_counter()``). benchmarks/ measures speed on
purpose and is not scanned."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

TIMED = re.compile(r"elapsed|took|seconds|duration|wall|waited|_s$|_ms$")
CLOCKS = {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time", "time_ns"}
# ``time`` alone is too common a word to count as a clock when called bare: only ``time.time()``
BARE_CLOCKS = CLOCKS - {"time"}
# a count of timings is not a time
COUNTS = {"len"}


def _identifiers(node: ast.AST):
    """The identifiers ``node`` reads (names, attributes, string subscript keys), not looking
    into calls that count."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in COUNTS:
        return
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, ast.Attribute):
        yield node.attr
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(
            node.slice.value, str):
        yield node.slice.value
    for child in ast.iter_child_nodes(node):
        yield from _identifiers(child)


def _clock_call(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if not isinstance(sub, ast.Call):
            continue
        func = sub.func
        if isinstance(func, ast.Attribute) and func.attr in CLOCKS and isinstance(func.value, ast.Name) and (
                func.value.id == "time"):
            return True
        if isinstance(func, ast.Name) and func.id in BARE_CLOCKS:
            return True
    return False


def _timed(node: ast.AST) -> bool:
    return _clock_call(node) or any(TIMED.search(name) for name in _identifiers(node))


def _number(node: ast.AST) -> bool:
    """A literal number, arithmetic on them, or a module constant (``FAST_S``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _number(node.operand)
    if isinstance(node, ast.BinOp):
        return _number(node.left) and _number(node.right)
    if isinstance(node, ast.Name):
        return node.id.isupper()
    return False


def _upper_bound(left: ast.AST, op: ast.cmpop, right: ast.AST) -> bool:
    if isinstance(op, (ast.Lt, ast.LtE)):  # x < n
        return _timed(left) and _number(right)
    if isinstance(op, (ast.Gt, ast.GtE)):  # n > x
        return _number(left) and _timed(right)
    return False


def time_bounds(source: str, filename: str = "<string>") -> list[str]:
    """``file:line: assertion`` for each assert in ``source`` that bounds a time from above."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Assert):
            continue
        for cmp in (c for c in ast.walk(node.test) if isinstance(c, ast.Compare)):
            sides = [cmp.left, *cmp.comparators]
            if any(_upper_bound(a, op, b) for a, op, b in zip(sides, cmp.ops, sides[1:])):
                found.append(f"{filename}:{node.lineno}: {ast.get_source_segment(source, node.test)}")
                break
    return found


@pytest.mark.timeout(60)
def test_no_test_asserts_an_upper_time_bound():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        found += time_bounds(path.read_text(), str(path.relative_to(TESTS.parent)))
    assert not found, ("tests assert an upper bound on wall-clock time, which a busy machine breaks; "
                       "bound the wait and assert what happened instead:\n  " + "\n  ".join(found))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("code", [
    "assert elapsed < 20",
    "assert res['elapsed'] < 20.0, res",
    "assert results[0]['shutdown_s'] <= 20",
    "assert 4.0 <= seconds < 30",
    "assert 30 > took",
    "assert max(took) < 20",
    "assert max(d['seconds'] for d in done) < 30",
    "assert time.monotonic() - start < 40",
    "assert perf_counter() - t0 < 1",
    "assert ok and self.wall_ms < 5",
    "assert res['waited'] < 30.0 and res['after'] < 30.0, res",
    "assert seconds[kind] < FAST_S",
])
def test_the_scan_reports_an_upper_bound(code):
    found = time_bounds(f"import time\n\n\ndef test():\n    {code}\n", "tests/t.py")
    assert found == [f"tests/t.py:5: {code[len('assert '):].split(', ')[0]}"], found


@pytest.mark.timeout(60)
@pytest.mark.parametrize("code", [
    "assert seconds >= 4.0",
    "assert 4.0 <= res['elapsed']",
    "assert time.monotonic() < deadline",
    "assert len(took) < 3",
    "assert n_ranks < 4",
    "assert elapsed < limit",
    "if elapsed < 20:\n        pass",
    "x = elapsed < 20",
])
def test_the_scan_allows_lower_bounds_and_other_comparisons(code):
    assert time_bounds(f"import time\n\n\ndef test():\n    {code}\n") == []
