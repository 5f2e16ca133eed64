"""The map of the code (docs/architecture.md) and the pages' references, against the tree.

- every module of src/accord is named in the map, and the generated section is what
  scripts/module_map.py writes today (a module's docstring changed: run the script);
- every ``accord.x.y`` name the pages mention (docs/*.md, README.md, SECURITY.md) is a module, or
  a name a module defines or exports;
- every file path they mention exists.

A path counts as this repository's when its first folder is one of the tree's (``src/``,
``tests/``, ``engine/``, ``accord/``, ...); it is looked up the way a reader reads it: from the
folders of the paths named before it in the same paragraph (the latest first, each with its
parents), then from the repository's root, ``src/accord``, ``src`` and the page's own folder.
Bare file names (``plan.py``) are looked up the same way. Nothing is imported but the script
(``ast`` reads the modules), so this runs without torch.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "SECURITY.md"] + sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))

# Paths whose first folder is one of ours but that name another project's files, or no file.
NOT_OUR_PATHS = {
    "examples/pytorch/", "examples/elastic/pytorch/", "examples/mxnet/mxnet_mnist.py",  # Horovod's
    "data/elastic_torch_main.py",                                                      # Horovod's
    "tools/launch.py", "tests/python/unittest/test_kvstore_custom.py",                 # MXNet's
    "accord/elastic/*",                                        # a key prefix in the job's store
}
# Bare file names that are not this repository's: the user's own scripts and files in the examples,
# and MXNet's (its launcher, its fit.py, its kvstore tests).
NOT_OUR_FILES = {"train.py", "ddp_train.py", "script.py", "elastic_train.py", "first_collective.py",
                 "discover.sh", "hosts.txt",
                 "launch.py", "fit.py", "test_kvstore.py", "dist_sync_kvstore.py"}
# docs/horovod-parity.md names Horovod's and MXNet's own tests and examples by their bare names; its
# paths with a folder are still checked.
BARE_NAMES_NOT_CHECKED = {"docs/horovod-parity.md"}

_URL = re.compile(r"\b[a-z][\w+.-]*://\S*")
_ACCORD_NAME = re.compile(r"(?<![\w./-])accord(?:\.\w+)+")
_EXTENSIONS = "py|md|sh|json|jsonl|toml|txt|yaml|yml|cfg|ini|xml"
_PATH = re.compile(rf"(?<![\w./<>*$~-])((?:\.\.?/)*(?:[\w.*-]+/)+(?:[\w.*-]+)?|[\w*-]+\.(?:{_EXTENSIONS}))(?![\w/<])")


def _load_script():
    spec = importlib.util.spec_from_file_location("_accord_module_map", ROOT / "scripts" / "module_map.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


module_map = _load_script()


def _read(doc: str) -> str:
    return (ROOT / doc).read_text(encoding="utf-8")


# Folders of the working tree that are not the repository's: environments, caches, build output
# (site/: the docs site scripts/docs.sh builds).
_NOT_THE_TREE = re.compile(r"^(\.(?!ci$).*|__pycache__|.*\.egg-info|build|dist|node_modules|site)$")


@functools.lru_cache(maxsize=1)
def _tree() -> tuple[frozenset[str], frozenset[str]]:
    """The repository's files and folders as paths relative to the root, and its folders' names."""
    found, folder_names = set(), {".", ".."}
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [s for s in subfolders if not _NOT_THE_TREE.match(s)]
        relative = Path(folder).relative_to(ROOT)
        found.update(str(relative / name) for name in subfolders + files)
        folder_names.update(subfolders)
    return frozenset(found), frozenset(folder_names)


def _exists(path: Path) -> bool:
    """A tracked file or folder, or a glob that matches one (paths are relative to the root)."""
    try:
        relative = str(path.resolve().relative_to(ROOT))
    except ValueError:
        return False
    if "*" in relative:
        pattern = re.compile(re.escape(relative).replace(r"\*", r"[^/]*") + "$")
        return any(pattern.match(p) for p in _tree()[0])
    return relative in _tree()[0]


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", _URL.sub(" ", text)) if p.strip()]


def _unresolved(text: str, page_folder: Path, bare_names: bool = True) -> list[str]:
    """The paths of a page's ``text`` that name nothing in the tree, in order."""
    missing = []
    for paragraph in _paragraphs(text):
        seen: list[Path] = []  # folders of the paths resolved so far, the latest first
        for token in _PATH.findall(paragraph):
            token = token.rstrip(".")
            if token.startswith("./"):
                token = token[2:]
            if token in NOT_OUR_PATHS or "<" in token:
                continue
            if "/" in token:
                if token.split("/")[0] not in _tree()[1]:
                    continue
            elif token in NOT_OUR_FILES or not bare_names:
                continue
            starts = [base for folder in seen for base in (folder, *folder.parents)] + \
                [ROOT, ROOT / "src" / "accord", ROOT / "src", page_folder]
            found = next((base / token for base in starts if _exists(base / token)), None)
            if found is None:
                missing.append(token)
                continue
            seen.insert(0, found if token.endswith("/") else found.parent)
    return missing


def _unresolved_paths(doc: str) -> list[str]:
    return _unresolved(_read(doc), (ROOT / doc).parent, bare_names=doc not in BARE_NAMES_NOT_CHECKED)


@functools.lru_cache(maxsize=None)
def _top_level_names(module: str) -> frozenset[str]:
    """What a module defines or imports at its top level, what its ``__all__`` lists, and the
    strings it names (a package's lazy ``__getattr__`` exports those)."""
    tree = ast.parse(module_map.modules()[module].read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    names.update(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return frozenset(names)


def _names_something(name: str) -> bool:
    """A module, or ``module.attribute[.more]`` where the module defines or exports the attribute."""
    modules = module_map.modules()
    if name in modules:
        return True
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        if module in modules:
            return parts[cut] in _top_level_names(module)
    return False


def test_every_module_is_named_in_the_map():
    named = set(re.findall(r"`(accord[\w.]*)`", _read("docs/architecture.md")))
    missing = sorted(set(module_map.modules()) - named)
    assert not missing, f"modules docs/architecture.md does not name (run scripts/module_map.py): {missing}"


def test_the_module_map_is_what_the_script_writes():
    assert module_map.current() == module_map.render(), (
        "docs/architecture.md's module map is stale: run python scripts/module_map.py")


def test_the_map_follows_the_layers_bottom_first():
    section = module_map.current()
    headings = re.findall(r"^### (.+)$", section, flags=re.M)
    assert headings == [layer for layer, _ in module_map.layers()]


def test_every_accord_name_on_the_pages_exists():
    unknown = {}
    for doc in DOCS:
        for name in sorted(set(_ACCORD_NAME.findall(_read(doc)))):
            if not _names_something(name):
                unknown.setdefault(doc, []).append(name)
    assert not unknown, f"accord names that are no module nor a module's name: {unknown}"


def test_every_file_path_on_the_pages_exists():
    missing = {doc: found for doc in DOCS if (found := _unresolved_paths(doc))}
    assert not missing, f"paths on the pages that name nothing in the tree: {missing}"


def test_the_path_check_sees_what_it_must():
    # Guards the reader: a path from the root, one under src/accord, one relative to the path
    # before it, and a stale one.
    assert _exists(ROOT / "tests" / "unit" / "test_import_graph.py")
    text = ("`accord/engine/engine.py` routes it (`cycle/controller.py`, `state.py`, `cycle/join.py`,\n"
            "`negotiation/join.py`, `server_core.py`); `tests/unit/`, `docs/launcher.md`.")
    assert _PATH.findall(text)[:3] == ["accord/engine/engine.py", "cycle/controller.py", "state.py"]
    assert _unresolved(text, ROOT / "docs") == ["cycle/join.py", "server_core.py"]
    assert _names_something("accord.engine.cycle.plan") and _names_something("accord.errors.CollectiveError")
    assert _names_something("accord.spawn") and not _names_something("accord.engine.nothing_here")
