"""The classes a stored typed value may name: tether never imports a module because a row
says so. A class is known once this process wrote a value of it, once `register_type` named
it, or once an annotation declared it: a node's (its state and what it returns) or a journaled
call's function's (what it returns), read the first time a stored value names a class not yet
known. Anything else is refused with UnknownType, naming the class and the ways to allow it.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from . import _typed

C = TypeVar("C", bound=type)

_pending: list[Callable[..., Any]] = []
"""Functions (nodes) whose annotations are read at the first miss, then dropped from here."""

_seen: set[int] = set()
"""ids of the annotation holders already walked (functions and classes)."""


def register_type(cls: C) -> C:
    """Allow values of `cls` (a dataclass, an enum, a pydantic model, or a class holding them)
    in the journal and in typed state, beyond those the nodes' annotations declare; returns
    `cls`, so it serves as a class decorator. The classes its fields name are allowed too."""
    if not isinstance(cls, type):
        raise TypeError(f"tether.register_type() takes a class, got {cls!r}")
    try:
        _typed.class_path(cls)
    except _typed.Bad as bad:
        raise TypeError(f"tether.register_type({cls.__qualname__}): {bad.why}") from None
    _walk(cls, 0)
    return cls


def declare_later(fn: Callable[..., Any]) -> None:
    """Read `fn`'s annotations when a stored value first names a class not yet known."""
    _pending.append(fn)


def declare(fn: Any) -> None:
    """Allow the classes `fn`'s annotations name (parameters and return, nested in generics,
    fields of dataclasses and TypedDicts); annotations that do not resolve are skipped."""
    if id(fn) in _seen:
        return
    _seen.add(id(fn))
    target = getattr(fn, "__func__", fn)  # a bound method's function
    for hint in _hints(target).values():
        _walk(hint, 0)


def _hints(obj: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(obj, include_extras=False)
    except Exception:  # a forward reference that names nothing, an object with no hints
        return {}


def _walk(hint: Any, depth: int) -> None:
    if depth > 20:
        return
    for arg in typing.get_args(hint):
        _walk(arg, depth + 1)
    origin = typing.get_origin(hint)
    if origin is not None or not isinstance(hint, type) or id(hint) in _seen:
        return
    _seen.add(id(hint))
    if _storable(hint):
        try:
            _typed.class_path(hint)
        except _typed.Bad:
            return
    if dataclasses.is_dataclass(hint) or typing.is_typeddict(hint):
        for field_hint in _hints(hint).values():
            _walk(field_hint, depth + 1)


def _storable(cls: type) -> bool:
    return (dataclasses.is_dataclass(cls) or issubclass(cls, enum.Enum)
            or _typed.is_model_class(cls))


def _on_miss() -> bool:
    """Read the pending annotations; whether there were any."""
    if not _pending:
        return False
    while _pending:
        declare(_pending.pop())
    return True


_typed.on_miss = _on_miss
