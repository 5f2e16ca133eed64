"""The structure's numbers (scripts/structure_report.py) within their limits: a change that widens
a folder past its limit, defines a framework-neutral name twice, adds a config reader or leaves a
module out of docs/architecture.md's map fails here, with the check's own detail."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_report():
    spec = importlib.util.spec_from_file_location("_accord_structure_report", ROOT / "scripts" / "structure_report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


structure_report = _load_report()
CHECKS = structure_report.report()


def test_the_report_was_read():
    names = [c.name for c in CHECKS]
    assert len(set(names)) == len(names) and any("architecture.md" in n for n in names), names


@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_check_is_within_its_limit(check):
    assert check.ok, f"{check.name}: {check.value} (limit {check.limit}): {check.detail}"
