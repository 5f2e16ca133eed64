"""Every public callable the API reference renders documents its parameters and return value.

The reference pages (docs/reference/*.md) render objects with mkdocstrings (``::: accord.x``
blocks, options in mkdocs.yml and under each block). This test loads the same sources with
griffe, the library mkdocstrings uses, walks what those blocks render (a module's members that
pass the ``filters``, imported names only where the module exports them, a class's members, no
submodules, no inherited members), and fails, listing the offenders, for a public function,
method or class whose docstring

- is missing (mkdocstrings would silently leave the object out of the page),
- leaves a parameter out of its ``Args:`` section (``self``/``cls`` excepted; ``*args`` and
  ``**kwargs`` may be documented as a group, e.g. ``**kwargs: passed to ...``; a class documents
  its constructor's parameters in the class docstring: ``__init__`` is not rendered),
- has no ``Returns:`` (or, for a generator, ``Yields:``) section while the function returns
  something: its return annotation is not ``None``, or, unannotated, it has a ``return value``,
- has a section title right after a non-blank line (the parser reads it as the text of the
  section above: the section is lost from the page),
- or makes griffe warn (a documented parameter the signature lacks, a returned value with
  neither a type nor an annotation): the strict docs build fails on those, this test says where.

Properties need a docstring only (they render as attributes). Dunder methods are not rendered
(the ``!^_`` filter) and are not checked. Static: nothing is imported or started, a few seconds.
"""
from __future__ import annotations

import ast
import functools
import logging
import os
import re
import textwrap

import pytest

griffe = pytest.importorskip("griffe", reason="the docs extra is not installed: pip install -e '.[docs]'")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE = os.path.join(ROOT, "docs", "reference")
DEFAULT_FILTERS = ["!^_"]  # mkdocs.yml's handler options


def _blocks():
    """(identifier, filters, members) for each ``::: identifier`` block of the reference pages."""
    for page in sorted(os.listdir(REFERENCE)):
        if not page.endswith(".md"):
            continue
        with open(os.path.join(REFERENCE, page), encoding="utf-8") as fh:
            text = fh.read()
        for match in re.finditer(r"^::: (\S+)\n((?:[ \t]+\S.*\n?)*)", text, re.M):
            options = match.group(2)
            filters = re.search(r"^\s+filters:\s*\[(.*)\]", options, re.M)
            members = re.search(r"^\s+members:\s*\[(.*)\]", options, re.M)
            yield (match.group(1),
                   [f.strip().strip("\"'") for f in filters.group(1).split(",")] if filters else DEFAULT_FILTERS,
                   [m.strip().strip("\"'") for m in members.group(1).split(",")] if members else None)


def _keep(name: str, filters: list[str]) -> bool:
    # mkdocstrings' _keep_object: the last matching pattern decides; with only inclusions,
    # no match rejects.
    keep = None
    for pattern in filters:
        exclude = pattern.startswith("!")
        if re.search(pattern[1:] if exclude else pattern, name):
            keep = not exclude
    if keep is None:
        return any(p.startswith("!") for p in filters)
    return keep


def _target(obj):
    if obj.is_alias:
        try:
            return obj.final_target
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None
    return obj


def _children(obj, filters, members):
    """The members mkdocstrings renders (templates/material/_base/children.html.jinja)."""
    for child in obj.members.values():
        target = _target(child)
        if child.inherited or target is None or target.is_module:  # no submodules, nothing external
            continue
        if members is not None:
            if child.name in members:
                yield child
            continue
        if not _keep(child.name, filters):
            continue
        if child.is_imported and not child.is_public:
            continue
        yield child


_TITLE = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Yields|Raises|Examples?|Notes?|Attributes):\s*$")


def _glued_titles(docstring) -> list[str]:
    """Section titles right after a non-blank line: Google-style parsers (griffe's included)
    read them as text of the section above, so the section silently disappears."""
    lines = docstring.value.splitlines() if docstring is not None else []
    return [line.strip() for before, line in zip(lines, lines[1:]) if _TITLE.match(line) and before.strip()]


class _Warnings(logging.Handler):
    """Collects what griffe logs while parsing a docstring (``mkdocs build --strict`` fails on it)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage().split(": ", 1)[-1])


def _parse_warnings(docstring) -> list[str]:
    logger = logging.getLogger("griffe")
    handler, level, propagate = _Warnings(), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    try:
        docstring.parse("google")  # mkdocstrings' defaults: unknown parameters, missing types
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
    return handler.messages


def _documented(docstring) -> tuple[set[str], set[str]]:
    names, kinds = set(), set()
    if docstring is None:
        return names, kinds
    for section in docstring.parse("google", warn_missing_types=False, warn_unknown_params=False):
        kinds.add(section.kind.value)
        if section.kind is griffe.DocstringSectionKind.parameters:
            names.update(param.name.lstrip("*") for param in section.value)
    return names, kinds


def _returns_something(function) -> bool:
    annotation = function.returns
    if annotation is not None:
        return str(annotation).strip("'\"") not in ("None", "NoReturn", "Never", "typing.NoReturn")
    if not function.source:
        return False
    try:
        tree = ast.parse(textwrap.dedent(function.source))
    except SyntaxError:
        return False
    body = tree.body[0] if tree.body else None
    stack = list(getattr(body, "body", []))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Return) and node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None):
            return True
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
        stack.extend(ast.iter_child_nodes(node))
    return False


def _parameters(function, skip_first: bool) -> list[griffe.Parameter]:
    params = list(function.parameters)
    if skip_first and params and params[0].name in ("self", "cls"):
        params = params[1:]
    return [p for p in params if p.name not in ("self", "cls")]


def _undocumented(params, names: set[str]) -> list[str]:
    """The parameters missing from ``names``; ``*args``/``**kwargs`` count as one group."""
    variadic = [p for p in params if p.kind in (griffe.ParameterKind.var_positional, griffe.ParameterKind.var_keyword)]
    missing = [p.name for p in params if p.name not in names and p not in variadic]
    if variadic and not any(p.name in names for p in variadic):
        missing.append("/".join(("*" if p.kind is griffe.ParameterKind.var_positional else "**") + p.name
                                for p in variadic))
    return missing


def _documented_in_a_base(function) -> bool:
    cls = function.parent
    if cls is None or not cls.is_class:
        return False
    try:
        bases = cls.mro()
    except ValueError:  # a base outside the package
        return False
    return any(function.name in base.members and _target(base.members[function.name]) is not None
               and _target(base.members[function.name]).docstring for base in bases)


def _check_function(path, function, problems, *, is_method):
    if not function.docstring and is_method and _documented_in_a_base(function):
        return  # an override without a docstring is not rendered; the base class documents it
    if not function.docstring:
        problems[path] = "no docstring"
        return
    names, kinds = _documented(function.docstring)
    missing = _undocumented(_parameters(function, is_method and "staticmethod" not in function.labels), names)
    issues = [f"no blank line before {title!r}" for title in _glued_titles(function.docstring)]
    issues += _parse_warnings(function.docstring)
    if missing:
        issues.append("missing Args: " + ", ".join(missing))
    if _returns_something(function) and not kinds & {"returns", "yields"}:
        issues.append("missing Returns")
    if issues:
        problems[path] = "; ".join(issues)


def _check_class(path, cls, problems, checked, filters):
    if not cls.docstring:
        problems[path] = "no docstring"
    else:
        init = cls.members.get("__init__")
        init = _target(init) if init is not None else None
        if init is not None and init.is_function and not init.inherited:
            names, _ = _documented(cls.docstring)
            # (not __init__'s: the "!^_" filter leaves it off the page)
            missing = _undocumented(_parameters(init, True), names)
            issues = [f"no blank line before {title!r}" for title in _glued_titles(cls.docstring)]
            issues += _parse_warnings(cls.docstring)
            if missing:
                issues.append("missing Args (constructor): " + ", ".join(missing))
            if issues:
                problems[path] = "; ".join(issues)
    for child in _children(cls, filters, None):
        _walk(f"{path}.{child.name}", child, problems, checked, filters, None, parent_is_class=True)


def _walk(path, obj, problems, checked, filters, members, *, parent_is_class=False):
    target = _target(obj)
    if target is None:
        return
    path = path if target.is_module else target.path  # an object rendered on two pages counts once
    if target.is_module:
        for child in _children(target, filters, members):
            _walk(f"{path}.{child.name}", child, problems, checked, filters, None)
        return
    if target.is_class:
        _check_class(path, target, problems, checked, filters)
    elif target.is_function:
        _check_function(path, target, problems, is_method=parent_is_class)
    elif target.is_attribute and "property" in target.labels:  # griffe makes properties attributes
        if not target.docstring and not _documented_in_a_base(target):
            problems[path] = "no docstring"
    else:
        return  # constants and other attributes: not callables
    checked.add(path)


@functools.lru_cache(maxsize=1)
def _reference() -> tuple[frozenset[str], dict[str, str]]:
    """(every callable the reference pages render, {name: what its docstring lacks})."""
    loader = griffe.GriffeLoader(search_paths=[os.path.join(ROOT, "src")], docstring_parser="google",
                                 allow_inspection=False)
    blocks = list(_blocks())
    with griffe.logger.disable():  # (the loader's own messages: aliases it cannot resolve, ...)
        for package in sorted({identifier.split(".")[0] for identifier, _, _ in blocks}):
            loader.load(package)  # the whole package, once (each load parses every module again)
        loader.resolve_aliases(implicit=False, external=False)
    problems: dict[str, str] = {}
    checked: set[str] = set()
    for identifier, filters, members in blocks:
        _walk(identifier, loader.modules_collection.get_member(identifier), problems, checked, filters, members)
    return frozenset(checked), problems


def test_the_walk_covers_every_reference_page():
    blocks = [identifier for identifier, _, _ in _blocks()]
    assert "accord.torch" in blocks and "accord.kvstore.base.KVStoreBase" in blocks, blocks
    checked, _ = _reference()
    assert len(checked) > 250, len(checked)  # 281 when this was written
    for name in ("accord.frontend.queries.rank", "accord.torch.compiled.allreduce",
                 "accord.mxnet.kvstore.AccordKVStore.push", "accord.kvstore.base.KVStoreBase.pull",
                 "accord.hapi.model.Model.fit", "accord.hapi.callbacks.Callback.on_epoch_end",
                 "accord.data.split.split_batch", "accord.run.functions.spawn.SpawnContext.join",
                 "accord.torch.elastic.state.TorchState"):
        assert name in checked, name


def test_the_check_finds_what_a_docstring_lacks():
    module = griffe.visit("m", filepath=os.path.join(ROOT, "m.py"), code=textwrap.dedent('''
        def bare(x) -> int:
            return x

        def no_returns(x: int, *args, **kwargs) -> int:
            """Summary.

            Args:
                x: a number.
            """
            return x

        def glued(x: int) -> int:
            """Summary.

            Args:
                x: a number.
            Returns:
                x.
            """
            return x

        def complete(x: int, **kwargs: int) -> None:
            """Summary.

            Args:
                x: a number.
                **kwargs: passed on.
            """
        '''), docstring_parser="google")
    problems: dict[str, str] = {}
    for name in ("bare", "no_returns", "glued", "complete"):
        _check_function(name, module[name], problems, is_method=False)
    assert problems == {"bare": "no docstring",
                        "no_returns": "missing Args: *args/**kwargs; missing Returns",
                        "glued": "no blank line before 'Returns:'; missing Returns"}


def test_every_rendered_callable_documents_its_parameters_and_return_value():
    _, problems = _reference()
    message = "\n".join(f"{name}: {why}" for name, why in sorted(problems.items()))
    assert not problems, f"{len(problems)} rendered callables lack docstring sections:\n{message}"
