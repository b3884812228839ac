"""Dashboard actions the API had and the pages lacked: mail to a run (an actor's inbox, from
the run page) and releasing a dead worker's runs (from /ui/workers)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import orjson
from fastapi import APIRouter, Request, Response

from ..errors import DefinitionError, InvalidState, RunNotFound, SerializationError
from ..runtime import Runtime
from .dashboard_input import Refused, check_id

Handler = Callable[[Request, dict[str, str]], Awaitable[Response]]
NOTICES = {
    "sent": "Message sent: the run reads it at its next receive().",
    "released": "Worker released: its runs are queued for any worker, from their last "
                "checkpoint.",
}


def add_more_actions(router: APIRouter, runtime: Runtime, actor: str,
                     action: Callable[[Handler, Any], Callable[[Request], Awaitable[Response]]],
                     back_to_run: Any, back_to: Any,
                     done: Callable[[Request, str, str], Response],
                     record: Callable[..., None]) -> None:
    async def do_send(request: Request, fields: dict[str, str]) -> Response:
        tid = check_id(request.path_params["thread_id"], "thread_id")
        raw = fields.get("message", "")
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise Refused(400, f"Message (JSON) is not valid JSON ({exc}); a string is quoted:"
                               ' "hello". Nothing was sent.') from None
        sender = fields.get("sender") or None
        if sender is not None:
            sender = check_id(sender, "Sender")
        try:
            mid = await runtime.send(tid, message, sender=sender, actor=actor)
        except RunNotFound:
            raise Refused(404, f"No run with thread_id {tid!r}; nothing was sent.") from None
        except (InvalidState, SerializationError) as exc:
            raise Refused(409 if isinstance(exc, InvalidState) else 400,
                          f"{exc}. Nothing was sent.") from None
        record(request, "send", thread_id=tid, message_id=mid)
        return done(request, f"/ui/runs/{quote(tid, safe='')}", "sent")

    async def do_release(request: Request, fields: dict[str, str]) -> Response:
        worker = check_id(fields.get("worker"), "Worker")
        live = {w.id: w for w in await runtime.workers()}
        found = live.get(worker)
        if found is not None and found.alive:
            raise Refused(409, f"Worker {worker!r} is alive (it beat {found.last_seen:.0f}); "
                               "only a dead worker's runs are released here. Nothing was "
                               "changed.")
        try:
            released = await runtime.release_worker(worker, actor=actor)
        except DefinitionError as exc:
            raise Refused(400, f"{exc}. Nothing was changed.") from None
        record(request, "release", worker=worker, runs=len(released))
        return done(request, "/ui/workers", "released")

    router.add_api_route("/ui/runs/{thread_id:path}/send", action(do_send, back_to_run),
                         methods=["POST"])
    router.add_api_route("/ui/workers/release", action(do_release, back_to), methods=["POST"])
