"""The thread ids a new run may take, the same on every surface (Python, CLI, HTTP)."""

from __future__ import annotations

import re

from .errors import DefinitionError

THREAD_ID_RULE = ("1 to 200 characters, none of them '/' or a control character (letters, "
                  "digits, spaces and punctuation such as - _ . : @ are fine)")
"""The thread ids every surface accepts: a '/' would make the run unreachable over HTTP."""
THREAD_ID_PATTERN = r"^[^/\x00-\x1f\x7f]+$"
"""The same rule as a JSON Schema pattern (the HTTP API's)."""
_BAD_THREAD_ID = re.compile(r"[/\x00-\x1f\x7f]")


def check_thread_id(thread_id: object, what: str = "thread_id") -> str:
    """`thread_id` if a new run may take it, else DefinitionError saying what is allowed."""
    if not isinstance(thread_id, str) or not 0 < len(thread_id) <= 200:
        got = (f"{len(thread_id)} characters" if isinstance(thread_id, str)
               else type(thread_id).__name__)
        raise DefinitionError(f"{what} must be a string of {THREAD_ID_RULE}, got {got}")
    bad = _BAD_THREAD_ID.search(thread_id)
    if bad is not None:
        raise DefinitionError(f"{what} {thread_id!r} holds {bad.group()!r}: a thread id is "
                              f"{THREAD_ID_RULE}")
    return thread_id
