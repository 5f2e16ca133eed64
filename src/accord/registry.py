"""Named registries of pluggable parts (backends, kvstore types, optimizers, models, launchers).

Every registry follows the same two rules: a name already taken is refused unless the caller
says ``override=True`` (so two plug-ins cannot silently replace each other), and an unknown name
is an error that lists the known ones. A :class:`Registry` is a ``dict`` of name -> entry, so
reading it (and restoring a saved copy in tests) is plain dictionary use.
"""
from __future__ import annotations

from typing import Any, Generic, TypeVar

from accord.errors import ConfigError, with_hint

__all__ = ["Registry"]

T = TypeVar("T")


def _shown(entry: Any) -> str:
    """A short description of a registered entry for messages."""
    if isinstance(entry, str):
        return entry
    module = getattr(entry, "__module__", None)
    name = getattr(entry, "__qualname__", None)
    return f"{module}.{name}" if module and name else repr(entry)


class Registry(dict[str, T], Generic[T]):
    """Entries by name; see the module docstring for the rules.

    Args:
        kind: what an entry is, for messages ("communication backend", "kvstore type").
        register_with: how users add one, for hints ("accord.comm.register_backend(name, factory)").
        unknown_error: the exception class :meth:`unknown` builds for an unknown name.
    """

    def __init__(self, kind: str, register_with: str, unknown_error: type[Exception] = ValueError,
                 entries: dict[str, T] | None = None) -> None:
        super().__init__(entries or {})
        self.kind = kind
        self.register_with = register_with
        self.unknown_error = unknown_error

    def add(self, name: str, entry: T, *, override: bool = False, taken: bool = False) -> None:
        """Register ``entry`` as ``name``.

        Registering the same entry again is a no-op. ``taken`` marks a name the caller's own
        bookkeeping already uses (an alias, say), refused like a registered one.

        Raises:
            ConfigError: ``name`` is taken by another entry and ``override`` is False.
        """
        old = self.get(name)
        if not override and (taken or (name in self and old is not entry)):
            shown = f" ({_shown(old)})" if name in self else ""
            raise ConfigError(with_hint(
                f"{self.kind} {name!r} is already registered{shown}; refusing to replace it with "
                f"{_shown(entry)}",
                f"choose another name, or pass override=True to {self.register_with} to replace it"))
        self[name] = entry

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self)

    def unknown(self, name: Any, known: list[str] | None = None) -> Exception:
        """The error for an unknown ``name``, listing ``known`` (default: :meth:`names`)."""
        listed = ", ".join(self.names() if known is None else known) or "none"
        return self.unknown_error(with_hint(
            f"unknown {self.kind} {name!r}; known: {listed}",
            f"use one of the known names, or register yours with {self.register_with}"))
