#!/usr/bin/env python3
"""Write the module map of docs/architecture.md from the modules' own docstrings.

    python scripts/module_map.py           # rewrite the map's section of docs/architecture.md
    python scripts/module_map.py --check   # exit 1 when that section is not what this would write
    python scripts/module_map.py --print   # print the section

Every module of src/accord gets one line: its dotted name and the first sentence of its
docstring, so the map says what the code says about itself and a module cannot be left out.
Modules are grouped by layer, bottom first, in the order of the layers that
tests/unit/test_import_graph.py checks (``LAYERS``, read from there so that the order is stated
once); within a layer by package, and within a package by name, sub-packages nested under their
package. Everything is read with ``ast`` (nothing is imported), so this runs without torch.
Only the text between the two markers is written; the rest of the page is hand-written.
tests/unit/test_architecture_map.py fails when the section is stale.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
MAP = ROOT / "docs" / "architecture.md"
BEGIN = ("<!-- module map: written by scripts/module_map.py from the modules' docstrings; "
         "edit those and run it, not this section -->")
END = "<!-- end of the module map -->"

# Abbreviations whose period does not end a sentence.
_ABBREVIATION = re.compile(r"(?:\be\.g|\bi\.e|\betc|\bvs|\bcf)\.$")
# Sphinx roles: :mod:`name`, :func:`~a.b`, :mod:`text <target>`.
_ROLE = re.compile(r":[a-z]+:`~?([^`<]*?)\s*(?:<[^`>]*>)?`")


def layers() -> list[tuple[str, list[str]]]:
    """The layers, bottom first, as tests/unit/test_import_graph.py states and checks them."""
    path = ROOT / "tests" / "unit" / "test_import_graph.py"
    spec = importlib.util.spec_from_file_location("_accord_import_graph", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LAYERS


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of src/accord (a package by its ``__init__.py``)."""
    found = {}
    for path in sorted((SRC / "accord").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def first_sentence(module: str, path: Path) -> str:
    """The first sentence of the module's docstring, in Markdown, without a leading ``name:``."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    if not doc:
        raise SystemExit(f"{path}: no docstring: say in one sentence what the module does")
    text = " ".join(doc.split())
    for match in re.finditer(r"\.(?=\s|$)", text):
        if not _ABBREVIATION.search(text[:match.end()]):
            text = text[:match.end()]
            break
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`" if "<" not in m.group(0) else m.group(1), text)
    text = text.replace("``", "`")
    text = re.sub(rf"^`?{re.escape(module)}`?:\s*", "", text)
    return text


def _owner(module: str, packages: list[str]) -> str:
    """The listed package a module belongs to: the longest listed prefix (as the import test reads it)."""
    owners = [p for p in packages if module == p or module.startswith(p + ".")]
    if not owners:
        raise SystemExit(f"{module} is in no layer of tests/unit/test_import_graph.py's LAYERS")
    return max(owners, key=len)


def render() -> str:
    """The section between the markers (markers excluded), ending with a newline."""
    mods = modules()
    stated = layers()
    listed = [p for _, packages in stated for p in packages]
    lines: list[str] = []
    for layer, packages in stated:
        lines += [f"### {layer}", ""]
        for package in packages:
            members = sorted(m for m in mods if _owner(m, listed) == package)
            for module in members:
                depth = module.count(".") - package.count(".")
                lines.append(f"{'  ' * depth}- `{module}`: {first_sentence(module, mods[module])}")
        lines.append("")
    return "\n".join(lines)


def current() -> str:
    """What the page holds between the markers now."""
    text = MAP.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{MAP}: the module map's markers are missing:\n{BEGIN}\n{END}")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def write() -> bool:
    """Rewrite the section; True when it changed."""
    text = MAP.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    new = f"{head}{BEGIN}\n\n{render()}{END}{tail}"
    if new == text:
        return False
    MAP.write_text(new, encoding="utf-8")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="exit 1 when the map's section is stale")
    group.add_argument("--print", action="store_true", help="print the section instead of writing it")
    args = parser.parse_args()
    if args.print:
        sys.stdout.write(render())
        return 0
    if args.check:
        if current() != render():
            print(f"{MAP.relative_to(ROOT)}: the module map is stale: run python scripts/module_map.py",
                  file=sys.stderr)
            return 1
        return 0
    current()  # the markers must be there
    print(f"{MAP.relative_to(ROOT)}: " + ("module map rewritten" if write() else "module map already current"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
