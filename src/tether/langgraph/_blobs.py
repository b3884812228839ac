"""Channel blobs: versioned values, lists stored as the items they gained.

A channel's value is written once per version (lg_blobs); a checkpoint names the versions it
holds. A value that is a msgpack array extending the array this saver last wrote for the same
channel (the usual `Annotated[list, operator.add]` state) is stored as a *delta*: a msgpack
array of the new items, with the version it extends as base_version. Loading concatenates the
chain, so the bytes read back are exactly the bytes of the full value: the delta is decided by
comparing encoded bytes, never by trusting the items' equality.

A chain is at most MAX_CHAIN deltas long; a value the cache does not know (another process
wrote the previous version, or this one restarted) is written whole.

Stored bytes (blobs, writes, checkpoint bodies) of PACK_MIN bytes or more are zlib-compressed
when that saves at least an eighth; the row's type then ends with "+zlib". Postgres compresses
only rows over 2 kB, SQLite never, and most of these rows are a few hundred bytes.
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import StoreError

MSGPACK = "msgpack"
MAX_CHAIN = 64
_CHAIN_GUARD = 100_000  # no chain is longer; a longer walk is a cycle in corrupt rows
ZLIB = "+zlib"
PACK_MIN = 96
_CACHE_ENTRIES = 1024
_CACHE_MAX_VALUE = 1 << 22  # larger values are not kept in memory to be extended later


def pack(type_: str, data: bytes | None) -> tuple[str, bytes | None]:
    """Stored form of serialized bytes: compressed when that saves at least an eighth."""
    if data is None or len(data) < PACK_MIN:
        return type_, data
    packed = zlib.compress(data, 1)
    if len(packed) * 8 > len(data) * 7:
        return type_, data
    return type_ + ZLIB, packed


def unpack(type_: str, data: bytes | None) -> tuple[str, bytes | None]:
    if type_.endswith(ZLIB) and data is not None:
        return type_[:-len(ZLIB)], zlib.decompress(data)
    return type_, data


def array_header(data: bytes) -> tuple[int, int] | None:
    """(item count, header length) of a msgpack array, or None when `data` is no array."""
    if not data:
        return None
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F, 1
    if first == 0xDC and len(data) >= 3:
        return struct.unpack_from(">H", data, 1)[0], 3
    if first == 0xDD and len(data) >= 5:
        return struct.unpack_from(">I", data, 1)[0], 5
    return None


def pack_header(count: int) -> bytes:
    if count < 16:
        return bytes((0x90 | count,))
    if count < 1 << 16:
        return b"\xdc" + struct.pack(">H", count)
    return b"\xdd" + struct.pack(">I", count)


@dataclass(slots=True)
class _Known:
    version: str
    data: bytes
    count: int
    head: int  # header length
    depth: int  # deltas between this version and a full value


@dataclass(frozen=True, slots=True)
class Blob:
    """One lg_blobs row to write, stored form (`type`, `blob`: the delta when `base` is set),
    and the whole serialized value (`raw_type`, `raw`), written instead when the base turns out
    to be gone."""

    channel: str
    version: str
    type: str
    blob: bytes | None
    base: str | None
    raw_type: str
    raw: bytes | None

    @staticmethod
    def of(channel: str, version: str, type_: str, data: bytes | None,
           base: str | None = None, delta: bytes | None = None) -> Blob:
        stored_type, stored = pack(type_, data if base is None else delta)
        return Blob(channel, version, stored_type, stored, base, type_, data)

    def whole(self) -> Blob:
        return Blob.of(self.channel, self.version, self.raw_type, self.raw)


class BlobCache:
    """The last value this saver wrote per (thread, namespace, channel), to extend. Shared by
    the threads of sync callers: one lock around each operation."""

    def __init__(self) -> None:
        self._known: OrderedDict[tuple[str, str, str], _Known] = OrderedDict()
        self._lock = threading.Lock()

    def encode(self, thread_id: str, ns: str, channel: str, version: str,
               type_: str, data: bytes | None) -> Blob:
        with self._lock:
            return self._encode(thread_id, ns, channel, version, type_, data)

    def _encode(self, thread_id: str, ns: str, channel: str, version: str,
                type_: str, data: bytes | None) -> Blob:
        key = (thread_id, ns, channel)
        if type_ != MSGPACK or data is None or (header := array_header(data)) is None:
            self._known.pop(key, None)
            return Blob.of(channel, version, type_, data)
        count, head = header
        prev = self._known.get(key)
        if prev is not None and prev.version == version:  # stored already; the row stays
            return Blob.of(channel, version, type_, data)
        delta: bytes | None = None
        base: str | None = None
        depth = 0
        if (prev is not None and prev.depth < MAX_CHAIN
                and count >= prev.count
                and data.startswith(memoryview(prev.data)[prev.head:], head)):
            # The first prev.count items are byte for byte prev's (msgpack items delimit
            # themselves), so the rest are the items appended.
            tail = memoryview(data)[head + len(prev.data) - prev.head:]
            delta, base, depth = pack_header(count - prev.count) + tail, prev.version, prev.depth + 1
        if len(data) <= _CACHE_MAX_VALUE:
            self._known[key] = _Known(version, data, count, head, depth)
            self._known.move_to_end(key)
            if len(self._known) > _CACHE_ENTRIES:
                self._known.popitem(last=False)
        else:
            self._known.pop(key, None)
        return Blob.of(channel, version, type_, data, base, delta)

    def forget(self, thread_id: str, ns: str | None = None) -> None:
        """Drop what is known of a thread (of one namespace): its rows may be gone."""
        with self._lock:
            for key in [k for k in self._known
                        if k[0] == thread_id and (ns is None or k[1] == ns)]:
                del self._known[key]

    def clear(self) -> None:
        with self._lock:
            self._known.clear()


# (channel, version) -> (type, blob, base_version), as stored
BlobRows = dict[tuple[str, str], tuple[str, "bytes | None", "str | None"]]


def assemble(rows: BlobRows, channel: str, version: str) -> tuple[str, bytes | None]:
    """The (type, bytes) of a channel version, its delta chain concatenated."""
    parts: list[bytes] = []
    total = 0
    key = (channel, version)
    for _ in range(_CHAIN_GUARD):
        try:
            stored_type, stored, base = rows[key]
        except KeyError:
            raise StoreError(f"LangGraph blob {channel!r} version {key[1]!r} is missing: the "
                             "thread was pruned or deleted while it was being written") from None
        type_, blob = unpack(stored_type, stored)
        if base is None:
            if not parts:
                return type_, blob
            header = array_header(blob or b"")
            if header is None:
                raise StoreError(f"LangGraph blob {channel!r} version {key[1]!r} is no array")
            parts.append(memoryview(blob or b"")[header[1]:].tobytes())
            total += header[0]
            parts.reverse()
            return type_, pack_header(total) + b"".join(parts)
        header = array_header(blob or b"")
        if header is None:
            raise StoreError(f"LangGraph delta {channel!r} version {key[1]!r} is malformed")
        parts.append(memoryview(blob or b"")[header[1]:].tobytes())
        total += header[0]
        key = (channel, base)
    raise StoreError(f"LangGraph blob {channel!r} version {version!r}: delta chain too long")


def garbage(live: Iterable[tuple[str, str]],
            stored: Iterable[tuple[str, str, str | None]]) -> list[tuple[str, str]]:
    """The (channel, version) blobs of one namespace no checkpoint needs: `live` are the
    versions its checkpoints hold, `stored` its rows (channel, version, base_version). A
    version is needed when live or when a needed delta extends it."""
    bases = {(ch, v): b for ch, v, b in stored}
    need: set[tuple[str, str]] = set()
    todo = [k for k in live if k in bases]
    while todo:
        key = todo.pop()
        if key in need:
            continue
        need.add(key)
        base = bases.get(key)
        if base is not None:
            todo.append((key[0], base))
    return [k for k in bases if k not in need]
