"""Who reads accord's variables: only settings modules (and the entry points listed here) call
``accord.config.get``; every other module takes typed settings from its package's settings module.

Every module is parsed with ``ast`` (nothing is imported). A module reads config when it binds
``accord.config`` to a name (``from accord import config``, ``import accord.config as c``) and
calls ``get`` on that name, or imports ``get`` from ``accord.config`` and calls it.
"""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# A package's typed settings (engine/settings.py, runtime/settings.py, ...) and config itself.
SETTINGS_NAME = "settings.py"
CONFIG = "accord/config.py"
# Programs that may read their configuration themselves (``python -m`` mains, CLI mains), with
# the reason. None does today: each builds its package's settings.
ENTRY_POINTS: dict[str, str] = {}
# The most other modules that may still call config.get. Lower it as they move to settings
# modules; never raise it.
MOST_OTHER_READERS = 2


def _reads_config(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    modules, functions = set(), set()  # local names bound to accord.config / to its get
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "accord":
            modules |= {a.asname or a.name for a in node.names if a.name == "config"}
        elif isinstance(node, ast.ImportFrom) and node.module == "accord.config":
            functions |= {a.asname or a.name for a in node.names if a.name == "get"}
        elif isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == "accord.config" and a.asname}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "get" and isinstance(func.value, ast.Name) \
                and func.value.id in modules:
            return True
        if isinstance(func, ast.Name) and func.id in functions:
            return True
        # import accord.config (no alias): accord.config.get(...)
        if isinstance(func, ast.Attribute) and func.attr == "get" and isinstance(func.value, ast.Attribute) \
                and func.value.attr == "config" and isinstance(func.value.value, ast.Name) \
                and func.value.value.id == "accord":
            return True
    return False


def _readers() -> list[str]:
    return sorted(str(p.relative_to(SRC)) for p in (SRC / "accord").rglob("*.py") if _reads_config(p))


def _others(readers: list[str]) -> list[str]:
    return [r for r in readers if Path(r).name != SETTINGS_NAME and r != CONFIG and r not in ENTRY_POINTS]


def test_the_check_sees_a_settings_module_read_config():
    readers = _readers()
    assert "accord/engine/settings.py" in readers and "accord/runtime/settings.py" in readers
    # a parameter named config is not accord's (the kvstore optimizers' from_config(config))
    assert "accord/kvstore/optimizers.py" not in readers


def test_only_settings_modules_and_entry_points_read_config():
    others = _others(_readers())
    assert len(others) <= MOST_OTHER_READERS, (
        f"{len(others)} modules call accord.config.get outside settings modules (at most "
        f"{MOST_OTHER_READERS}): {others}. Read the variable in the package's settings.py (a frozen "
        "dataclass built where it is needed) and pass the value down")


def test_listed_entry_points_exist_and_still_read_config():
    readers = set(_readers())
    stale = [path for path in ENTRY_POINTS if path not in readers]
    assert not stale, f"these entry points no longer read config: remove them from ENTRY_POINTS: {stale}"
