"""StrictSerializer: LangGraph's checkpoint format, loading only the types it is told it may.

LangGraph's JsonPlusSerializer() writes a non-JSON value (a message, a dataclass, a pydantic
model, a datetime...) as a msgpack extension holding (module, name, arguments), and by default
reads one back by importing that module and calling that name with those arguments: whoever
can write a checkpoint row can run `os.system`. LangGraph's strict mode (an allow-list) does
not import what is refused, but hands back the raw arguments in its place with a log line, so
the graph goes on with a wrong value. Here a refused (module, name) is an error naming it, and
is never imported.

What is allowed: LangGraph's own list of types it considers safe to rebuild
(SAFE_MSGPACK_TYPES: the langchain_core messages, Document, Send, Interrupt, Command,
Overwrite, store items, and stdlib values such as datetime, UUID, Decimal, set, Path), every
message class langchain_core exports, and the types the application names (`allowed_types=`,
classes; or LangGraph's own `with_allowlist`, which a graph compiled under
LANGGRAPH_STRICT_MSGPACK=true applies with the types of its state schema). A class the
application names is called directly: its module is not imported again by name.

Writing is JsonPlusSerializer's, unchanged, so rows stay readable by LangGraph's own savers and
by tether versions before this one. Reading refuses the formats this serializer never writes
("pickle", LangGraph's legacy "json").
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Collection, Iterable
from datetime import datetime
from typing import Any

import ormsgpack
from langchain_core import messages as lc_messages
from langgraph.checkpoint.serde._msgpack import SAFE_MSGPACK_METHODS, SAFE_MSGPACK_TYPES
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import (
    EXT_CONSTRUCTOR_KW_ARGS,
    EXT_CONSTRUCTOR_POS_ARGS,
    EXT_CONSTRUCTOR_SINGLE_ARG,
    EXT_DELTA_SNAPSHOT,
    EXT_METHOD_SINGLE_ARG,
    EXT_NUMPY_ARRAY,
    EXT_PYDANTIC_V1,
    EXT_PYDANTIC_V2,
    JsonPlusSerializer,
)
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from ..errors import ConfigError, SerializationError

__all__ = ["StrictSerializer", "strict_serde"]

logger = logging.getLogger("tether.langgraph")

Key = tuple[str, str]


def _own_types() -> frozenset[Key]:
    """LangGraph's safe list, plus every message class langchain_core exports (its modules
    have moved between releases; the safe list names them where they were)."""
    own = {(key[0], key[1]) for key in SAFE_MSGPACK_TYPES if len(key) == 2}
    for name in getattr(lc_messages, "__all__", ()):
        cls = getattr(lc_messages, name, None)
        if isinstance(cls, type) and issubclass(cls, lc_messages.BaseMessage):
            own.add((cls.__module__, cls.__name__))
    return frozenset(own)


OWN_TYPES = _own_types()


def _key(kind: object) -> Key:
    if isinstance(kind, type):
        return kind.__module__, kind.__name__
    if (isinstance(kind, tuple) and len(kind) == 2
            and all(isinstance(part, str) for part in kind)):
        return kind[0], kind[1]
    raise ConfigError(f"allowed_types= takes classes, got {kind!r}")


def _refusal(module: str, name: str) -> str:
    return (f"refused to load {module}.{name} from a LangGraph checkpoint: it is neither one "
            "of LangGraph's own types nor in allowed_types= (it was not imported). If your "
            "graph's state holds it, allow it: TetherSaver(url, allowed_types=[...]) or "
            "tether.langgraph.agent(name, graph, allowed_types=[...])")


class _Refused(Exception):
    """Raised inside the ext hook to stop decoding; ormsgpack replaces it with a bare
    ValueError("ext_hook failed"), so the reason travels on the _Load instead."""


class _Load:
    """One msgpack load: the ext hook, and why it stopped if it did."""

    __slots__ = ("_serde", "problem")

    def __init__(self, serde: StrictSerializer) -> None:
        self._serde = serde
        self.problem: str | None = None

    def stop(self, problem: str) -> _Refused:
        self.problem = problem
        return _Refused(problem)

    def unpack(self, data: bytes) -> Any:
        return ormsgpack.unpackb(data, ext_hook=self.hook, option=ormsgpack.OPT_NON_STR_KEYS)

    def hook(self, code: int, data: bytes) -> Any:
        if code == EXT_DELTA_SNAPSHOT:
            return _DeltaSnapshot(self.unpack(data))
        if code == EXT_NUMPY_ARRAY:
            return _numpy(self.unpack(data))
        if code != EXT_METHOD_SINGLE_ARG and code not in _CONSTRUCTORS:
            raise self.stop(f"a LangGraph checkpoint holds a msgpack extension of unknown "
                            f"code {code} (written by a newer LangGraph?)")
        # Arguments are decoded first, through this hook: a nested value is checked as well.
        tup = self.unpack(data)
        if not (isinstance(tup, list) and len(tup) >= 3 and isinstance(tup[0], str)
                and isinstance(tup[1], str)):
            raise self.stop("a LangGraph checkpoint holds a malformed msgpack extension "
                            f"(code {code}): expected (module, name, arguments)")
        module, name, args = tup[0], tup[1], tup[2]
        try:
            cls = self._serde.resolve(module, name)
        except SerializationError as exc:
            raise self.stop(str(exc)) from None
        if code == EXT_METHOD_SINGLE_ARG:
            method = tup[3] if len(tup) > 3 else None
            if cls is None or not _method_allowed(cls, module, name, method):
                raise self.stop(_refusal(module, f"{name}.{method}"))
            return _build(module, name, args, lambda: getattr(cls, str(method))(args))
        if cls is None:
            raise self.stop(_refusal(module, name))
        return _CONSTRUCTORS[code](cls, module, name, args)


def _method_allowed(cls: Any, module: str, name: str, method: object) -> bool:
    # LangGraph writes datetimes (and their subclasses) as cls.fromisoformat(text).
    return ((module, name, method) in SAFE_MSGPACK_METHODS
            or (method == "fromisoformat" and isinstance(cls, type)
                and issubclass(cls, datetime)))


def _build(module: str, name: str, args: Any, make: Callable[[], Any]) -> Any:
    """An allowed type whose arguments it no longer accepts (the class changed since the row
    was written) reads back as its arguments, as with LangGraph's own serializer."""
    try:
        return make()
    except Exception as exc:
        logger.warning("could not rebuild %s.%s from a LangGraph checkpoint (%s); "
                       "returning its serialized data instead", module, name,
                       type(exc).__name__)
        return args


def _single(cls: Any, module: str, name: str, args: Any) -> Any:
    return _build(module, name, args, lambda: cls(args))


def _positional(cls: Any, module: str, name: str, args: Any) -> Any:
    def make() -> Any:
        if (module, name) == ("langgraph.types", "Send") and len(args) == 3:
            return cls(args[0], args[1], timeout=args[2])
        return cls(*args)
    return _build(module, name, args, make)


def _keywords(cls: Any, module: str, name: str, args: Any) -> Any:
    return _build(module, name, args, lambda: cls(**args))


def _pydantic(fallback: str) -> Callable[[Any, str, str, Any], Any]:
    """A model whose fields no longer validate is built without validation, as LangGraph does."""
    def build(cls: Any, module: str, name: str, args: Any) -> Any:
        def make() -> Any:
            try:
                return cls(**args)
            except Exception:
                return getattr(cls, fallback)(**args)
        return _build(module, name, args, make)
    return build


_CONSTRUCTORS: dict[int, Callable[[Any, str, str, Any], Any]] = {
    EXT_CONSTRUCTOR_SINGLE_ARG: _single,
    EXT_CONSTRUCTOR_POS_ARGS: _positional,
    EXT_CONSTRUCTOR_KW_ARGS: _keywords,
    EXT_PYDANTIC_V1: _pydantic("construct"),
    EXT_PYDANTIC_V2: _pydantic("model_construct"),
}


def _numpy(meta: Any) -> Any:
    # numpy is imported by its own name, never by one a row gives; dtype text cannot name
    # a Python type (object arrays cannot be built from a buffer).
    numpy = importlib.import_module("numpy")
    dtype, shape, order, buf = meta
    return numpy.frombuffer(buf, dtype=numpy.dtype(dtype)).reshape(shape, order=order)


class StrictSerializer(JsonPlusSerializer):
    """LangGraph's serializer (same bytes written), reading back only LangGraph's own types
    and `allowed_types`; any other type named in a row raises SerializationError naming it,
    without importing it. TetherSaver's default; pass one to wrap it, e.g.
    `TetherSaver(url, serde=EncryptedSerializer(cipher, StrictSerializer(allowed_types=[Order])))`.
    """

    def __init__(self, *, allowed_types: Iterable[type] = ()) -> None:
        # LangGraph's own strict settings underneath: what this class does not override
        # refuses too.
        super().__init__(allowed_msgpack_modules=None, allowed_json_modules=None)
        self._classes: dict[Key, Any] = {}
        self._names: set[Key] = set(OWN_TYPES)
        self._add(allowed_types)

    def _add(self, kinds: Iterable[object]) -> None:
        for kind in kinds:
            key = _key(kind)
            if isinstance(kind, type):
                self._classes[key] = kind
            else:
                self._names.add(key)

    @property
    def allowed(self) -> frozenset[Key]:
        """(module, name) of every type this serializer rebuilds."""
        return frozenset(self._names | self._classes.keys())

    def allowing(self, kinds: Iterable[object]) -> StrictSerializer:
        """A copy that also rebuilds `kinds` (classes, or (module, name) pairs)."""
        kinds = list(kinds)
        keys = {_key(kind) for kind in kinds}
        if keys <= self.allowed and all(self._classes.get(_key(k)) is k
                                        for k in kinds if isinstance(k, type)):
            return self
        clone = StrictSerializer()
        clone._classes = dict(self._classes)
        clone._names = set(self._names)
        clone._add(kinds)
        return clone

    def with_msgpack_allowlist(self, extra_allowlist: Iterable[tuple[str, ...] | type]
                               ) -> StrictSerializer:
        """LangGraph's hook (BaseCheckpointSaver.with_allowlist): graphs compiled with
        LANGGRAPH_STRICT_MSGPACK=true pass the types of their state schema here."""
        return self.allowing(k for k in extra_allowlist if isinstance(k, type) or len(k) == 2)

    def resolve(self, module: str, name: str) -> Any:
        """The class (module, name) names if it is allowed, else None (nothing imported)."""
        key = (module, name)
        cls = self._classes.get(key)
        if cls is not None or key not in self._names:
            return cls
        # An allowed name (LangGraph's safe list, or a pair given to with_allowlist):
        # importing it is what LangGraph's own serializer does for these.
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise SerializationError(f"{module}.{name}, named in a LangGraph checkpoint, "
                                     f"cannot be imported: {exc}") from None
        self._classes[key] = cls
        return cls

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_, raw = data
        if type_ == "msgpack":
            load = _Load(self)
            try:
                return load.unpack(raw)
            except ValueError as exc:
                if load.problem is not None:
                    raise SerializationError(load.problem) from None
                raise SerializationError(f"a LangGraph checkpoint value is not valid "
                                         f"msgpack: {exc}") from None
        if type_ in ("null", "bytes", "bytearray"):
            return super().loads_typed(data)
        raise SerializationError(
            f"refused to load a LangGraph checkpoint value stored as {type_!r}: "
            "tether's StrictSerializer reads only what it writes (msgpack); a row of another "
            "format was written by another serializer, or crafted. Pass that serializer as "
            "serde= to read it")


def strict_serde(serde: SerializerProtocol | None, allowed_types: Collection[type]
                 ) -> SerializerProtocol:
    """The serializer of `TetherSaver(url, serde=..., allowed_types=...)`."""
    for kind in allowed_types:
        if not isinstance(kind, type):
            raise ConfigError(f"allowed_types= takes classes, got {kind!r}")
    if serde is None:
        return StrictSerializer(allowed_types=allowed_types)
    if not allowed_types:
        return serde  # the application's own serializer decides what it loads
    if isinstance(serde, StrictSerializer):
        return serde.allowing(allowed_types)
    if isinstance(serde, EncryptedSerializer) and isinstance(serde.serde, StrictSerializer):
        return EncryptedSerializer(serde.cipher, serde.serde.allowing(allowed_types))
    raise ConfigError(
        f"allowed_types= applies to tether's StrictSerializer, and serde= is a "
        f"{type(serde).__name__}, which decides itself what it loads: pass "
        "serde=StrictSerializer(allowed_types=[...]) (inside an EncryptedSerializer if you "
        "encrypt), or configure your serializer's own allow-list")
