"""The web dashboard, served under /ui by `tether serve`: server-rendered pages (Jinja2) that
read without JavaScript, refreshed live with it (htmx + one SSE stream per tab, fed by one
poller per view: dashboard_live). Every action goes through the same Runtime calls as the
HTTP API and is logged on the `tether.audit` logger.

Sessions and CSRF: dashboard_auth (with a token, each session is a row of the store, revoked
by signing out). Every form posts `application/x-www-form-urlencoded` with a `csrf` field
(sign-out too); a refused action renders its page again with the reason, status 4xx, and has
changed nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import parse_qs, quote

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ..errors import (
    DefinitionError,
    InvalidState,
    ResumeConflict,
    RunNotFound,
    SerializationError,
    TetherError,
)
from ..records import checkpoint_of
from ..runtime import Runtime
from .dashboard_auth import COOKIE, SESSION_TTL, UiAuth
from .dashboard_input import Refused, RunFilter, check_id, parse_weights
from .dashboard_live import LiveHub
from .dashboard_more import NOTICES as MORE_NOTICES
from .dashboard_more import add_more_actions
from .dashboard_pages import PageViews, add_pages
from .dashboard_render import environment, render, state_diff, states_at, view_url
from .events import encode
from .streams import HeldStream, StreamSlots, client_of

T = TypeVar("T")
log = logging.getLogger("tether.dashboard")
audit = logging.getLogger("tether.audit")

STATIC = {
    "htmx.min.js": "text/javascript; charset=utf-8",
    "live.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "htmx.LICENSE.txt": "text/plain; charset=utf-8",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' "
                               "'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
NOTICES = {
    "cancelled": "Run cancelled.",
    "resumed": "Answer recorded; the run continues.",
    "forked": "Forked: this is the new run.",
    "retried": "Effect queued for another attempt.",
    "run-retried": "Run queued again from its failed step.",
    "routed": "Weights saved: new runs are routed by them.",
    "drained": "Draining: no new run goes to that version; its open runs finish on it.",
    "retired": "Retired: that version never takes a run again.",
    "signed-out": "Signed out.",
    **MORE_NOTICES,
}


async def unchanged_if_refused(call: Awaitable[T]) -> T:
    """Await a deploy call (route, drain, retire) of an action; a refusal by the Runtime
    (DefinitionError: bad input, 400; InvalidState: not now, 409) becomes the Refused the
    page shows with its message, having changed nothing."""
    try:
        return await call
    except (DefinitionError, InvalidState) as exc:
        raise Refused(409 if isinstance(exc, InvalidState) else 400,
                      f"{exc}. Nothing was changed.") from None


@dataclass(slots=True)
class Visit:
    """One request's session: its nonce, and the cookie to set if it was just issued."""

    nonce: str
    new_cookie: str | None


def dashboard_router(
    runtime: Runtime,
    *,
    token: str | None = None,
    read_only: bool = False,
    live_poll: float = 0.5,
    draining: Callable[[], bool] = lambda: False,
    actor: str = "dashboard",
    slots: StreamSlots | None = None,
) -> APIRouter:
    """The dashboard's routes, all under /ui and none in the OpenAPI schema. With `token`,
    every page and action needs a session made by signing in with it; `read_only` shows the
    views without any action. The audit log names `actor` for its actions. Live views hold
    one of `slots` each while open (429 past its caps)."""
    auth = UiAuth(token)
    hub = LiveHub(live_poll)
    env = environment()
    router = APIRouter(include_in_schema=False)
    static = {name: resources.files("tether.service").joinpath("static", name).read_bytes()
              for name in STATIC}

    # -- sessions, pages -------------------------------------------------------------------

    async def live_session(request: Request) -> str | None:
        """The nonce of the request's session: a cookie this key issued, not expired and,
        with a token, live in the store (not signed out): one indexed read."""
        nonce = auth.session(request.cookies.get(COOKIE))
        if nonce is None or not auth.required:
            return nonce
        await runtime.open()
        return nonce if await runtime.store.sessions.session_alive(auth.digest(nonce)) else None

    async def visit(request: Request) -> Visit | None:
        nonce = await live_session(request)
        if nonce is not None:
            return Visit(nonce, None)
        if auth.required:
            return None
        cookie = auth.new_session()
        nonce = auth.session(cookie)
        assert nonce is not None
        return Visit(nonce, cookie)

    def finish(request: Request, resp: Response, v: Visit | None) -> Response:
        resp.headers.update(SECURITY_HEADERS)
        if v is not None and v.new_cookie is not None:
            resp.set_cookie(COOKIE, v.new_cookie, max_age=int(SESSION_TTL), path="/ui",
                            httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return resp

    def to_login(request: Request) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return finish(request, RedirectResponse(f"/ui/login?next={quote(target)}", 303), None)

    def page(request: Request, v: Visit | None, name: str, status: int = 200,
             **ctx: Any) -> Response:
        notice = NOTICES.get(request.query_params.get("done", ""))
        base = {
            "csrf": auth.csrf(v.nonce) if v is not None else "",
            "can_act": not read_only, "read_only": read_only, "signed_in": auth.required,
            "now": time.time(), "notice": notice, "error": None, "live": None,
            "path": request.url.path, "fp": "", "view": None,
            "nav": "-" if v is not None else "",  # no navigation before signing in
        }
        if request.method != "GET":  # a refused action's page: live, it reloads its view
            base["view"] = view_url(ctx.get("live"))
        html = render(env, name, {**base, **ctx})
        return finish(request, HTMLResponse(html, status_code=status), v)

    def view(fn: Callable[[Request, Visit], Awaitable[Response]]) -> Callable[
            [Request], Awaitable[Response]]:
        """A GET page: needs a session (or signs one in), renders a Refused as its message."""

        async def handler(request: Request) -> Response:
            v = await visit(request)
            if v is None:
                return to_login(request)
            try:
                return await fn(request, v)
            except Refused as exc:
                return page(request, v, "message.html", exc.status, error=exc.message)

        return handler

    async def form(request: Request, v: Visit | None) -> dict[str, str]:
        """A POSTed action's form, its session (`v`) checked and its CSRF token verified."""
        if v is None:
            raise Refused(401, "Sign in first: this dashboard needs the server's token.")
        if read_only:
            raise Refused(403, "This dashboard is read-only (tether serve --read-only): "
                               "nothing was changed.")
        return await signed_form(request, v)

    async def signed_form(request: Request, v: Visit) -> dict[str, str]:
        """A POSTed form of session `v`, read and its CSRF token verified."""
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/x-www-form-urlencoded":
            raise Refused(415, "Forms must be sent as application/x-www-form-urlencoded.")
        try:
            parsed = parse_qs((await request.body()).decode("utf-8"), keep_blank_values=True,
                              strict_parsing=False, max_num_fields=200)
        except (UnicodeDecodeError, ValueError):
            raise Refused(400, "The form could not be read (at most 200 fields).") from None
        fields = {k: vals[-1] for k, vals in parsed.items()}
        if v.new_cookie is not None or not auth.check_csrf(v.nonce, fields.get("csrf")):
            raise Refused(403, "This form is stale: its security token belongs to another "
                               "session. Reload the page and try again. Nothing was changed.")
        return fields

    def done(request: Request, where: str, notice: str) -> Response:
        return finish(request, RedirectResponse(f"{where}?done={notice}", 303), None)

    def record(request: Request, action: str, **fields: Any) -> None:
        client = request.client.host if request.client else None
        audit.info("dashboard %s %s", action, fields,
                   extra={"action": action, "client": client, **fields})

    views = PageViews(runtime)
    overview_data, runs_data, run_data = views.overview, views.runs, views.run
    inbox_data, effects_data, probe = views.inbox, views.effects, views.probe

    # -- pages -----------------------------------------------------------------------------

    @router.get("/ui")
    @view
    async def overview(request: Request, v: Visit) -> Response:
        data = await overview_data()
        return page(request, v, "overview.html", nav="overview", live="overview", **data)

    @router.get("/ui/runs")
    @view
    async def runs(request: Request, v: Visit) -> Response:
        q = dict(request.query_params)
        try:
            f = RunFilter.parse(q)
            data = await runs_data(f)
        except Refused as exc:  # the form again, as typed, with the error beside it
            return page(request, v, "runs.html", exc.status, nav="runs", error=exc.message,
                        **views.refused_runs(RunFilter.as_typed(q)))
        return page(request, v, "runs.html", nav="runs", live="runs:" + f.query(), **data)

    @router.get("/ui/go")
    @view
    async def go(request: Request, v: Visit) -> Response:
        tid = check_id(request.query_params.get("thread_id"), "thread_id")
        try:
            await runtime.get(tid)
        except RunNotFound:
            raise Refused(404, f"No run with thread_id {tid!r}.") from None
        return finish(request, RedirectResponse(f"/ui/runs/{quote(tid, safe='')}", 303), v)

    @router.get("/ui/runs/{thread_id:path}/steps/{step}")
    @view
    async def step_page(request: Request, v: Visit) -> Response:
        tid = check_id(request.path_params["thread_id"], "thread_id")
        raw = request.path_params["step"]
        if not (raw.isdigit() and raw.isascii() and len(raw) < 12):
            raise Refused(400, f"A step is a whole number, got {raw!r}.")
        try:
            run = await runtime.peek(tid)
        except RunNotFound:
            raise Refused(404, f"No run with thread_id {tid!r}.") from None
        base, rows = await views.checkpoint_rows(tid)
        i = next((i for i, row in enumerate(rows) if row.step == int(raw)), None)
        if i is None:
            if 0 < int(raw) <= run.step:  # committed, then removed by `prune --keep-steps`
                raise Refused(410, f"Step {raw} of run {tid!r} is no longer kept: retention "
                                   f"compacted its log to {len(rows)} of its {run.step} steps "
                                   "(the run's page lists those kept).")
            raise Refused(404, f"Run {tid!r} has no committed step {raw}.")
        states = states_at(base, rows, range(max(0, i - 1), i + 1))
        cp = checkpoint_of(rows[i], states[i])
        calls, unreadable = [], None
        try:
            calls = await runtime.calls(tid, cp.step)
        except TetherError as exc:  # a typed result whose class this server cannot load
            unreadable = str(exc)
        return page(request, v, "step.html", nav="runs", run=run, cp=cp, calls=calls,
                    unreadable=unreadable,
                    diff=None if i == 0 else state_diff(states[i - 1], cp.state),
                    prev=rows[i - 1].step if i > 0 else None,
                    next=rows[i + 1].step if i + 1 < len(rows) else None)

    @router.get("/ui/runs/{thread_id:path}")
    @view
    async def run_page(request: Request, v: Visit) -> Response:
        tid = check_id(request.path_params["thread_id"], "thread_id")
        raw = request.query_params.get("steps", "")
        if raw and not (raw.isdigit() and raw.isascii() and len(raw) < 12):
            raise Refused(400, f"steps must be a step number, got {raw!r}.")
        data = await run_data(tid, int(raw) if raw else None)
        return page(request, v, "run.html", nav="runs", live="run:" + tid, **data)

    @router.get("/ui/interrupts")
    @view
    async def inbox(request: Request, v: Visit) -> Response:
        return page(request, v, "inbox.html", nav="inbox", live="inbox", **await inbox_data())

    @router.get("/ui/effects")
    @view
    async def effects(request: Request, v: Visit) -> Response:
        return page(request, v, "effects.html", nav="effects", live="effects",
                    **await effects_data())

    @router.get("/ui/deployments")
    @view
    async def deployments(request: Request, v: Visit) -> Response:
        return page(request, v, "deployments.html", nav="deployments", live="deployments",
                    **await views.deployments())

    @router.get("/ui/workers")
    @view
    async def workers(request: Request, v: Visit) -> Response:
        return page(request, v, "workers.html", nav="workers", live="workers",
                    **await views.workers())

    # -- live updates ----------------------------------------------------------------------

    @router.get("/ui/live")
    async def live(request: Request) -> Response:
        v = await visit(request)
        if v is None or v.new_cookie is not None:
            return finish(request, Response("sign in first", 401, media_type="text/plain"),
                          None)
        topic = request.query_params.get("topic", "")
        seen = request.query_params.get("fp", "")
        try:
            p = probe(topic) if len(topic) <= 2048 else None
        except Refused:
            p = None
        if p is not None:
            try:  # a run that does not exist is a 404 now, not a warning at every poll
                await p()
            except Refused:
                p = None
        if p is None:
            return finish(request, Response("unknown topic", 404, media_type="text/plain"),
                          None)

        slot = None if slots is None else slots.acquire(client_of(request.scope))

        async def frames() -> AsyncIterator[bytes]:
            yield b"retry: 2000\n\n"
            async with hub.follow(topic, p, seen) as changes:
                quiet = 0.0
                while not draining():
                    try:
                        await asyncio.wait_for(changes.get(), 1.0)
                    except TimeoutError:
                        quiet += 1.0
                        if quiet >= 15.0:
                            quiet = 0.0
                            yield encode(None)
                        continue
                    quiet = 0.0
                    yield encode({"type": "changed", "topic": topic})

        resp = HeldStream(frames(), slot=slot, media_type="text/event-stream",
                          headers={"X-Accel-Buffering": "no"})
        return finish(request, resp, None)

    @router.get("/ui/static/{name}")
    async def static_file(name: str) -> Response:
        if name not in STATIC:
            return Response("not found", 404, media_type="text/plain")
        return Response(static[name], media_type=STATIC[name],
                        headers={"Cache-Control": "public, max-age=3600",
                                 "X-Content-Type-Options": "nosniff"})

    # -- sign in ---------------------------------------------------------------------------

    def safe_next(target: str | None) -> str:
        if not target or not target.startswith("/ui") or target.startswith("//") or "\\" in target:
            return "/ui"
        return target

    @router.get("/ui/login")
    async def login_page(request: Request) -> Response:
        nxt = safe_next(request.query_params.get("next"))
        if not auth.required or await live_session(request) is not None:
            return finish(request, RedirectResponse(nxt, 303), None)
        return page(request, None, "login.html", nav="", next=nxt)

    @router.post("/ui/login")
    async def login(request: Request) -> Response:
        raw = (await request.body()).decode("utf-8", "replace")
        try:
            fields = {k: v[-1] for k, v in parse_qs(raw, max_num_fields=5).items()}
        except ValueError:  # more fields than a sign-in form has
            return page(request, None, "login.html", 400, nav="", next="/ui",
                        error="The sign-in form has two fields (token, next); this one had "
                              "more.")
        nxt = safe_next(fields.get("next"))
        if not auth.required:
            return finish(request, RedirectResponse(nxt, 303), None)
        if not auth.check_token(fields.get("token", "")):
            audit.info("dashboard sign-in refused", extra={"action": "login-refused"})
            return page(request, None, "login.html", 401, nav="", next=nxt,
                        error="Wrong token. Use the token `tether serve` was started with.")
        cookie = auth.new_session()
        nonce = auth.session(cookie)
        assert nonce is not None
        await runtime.open()  # the row first: the cookie is only good once it is stored
        await runtime.store.sessions.open_session(auth.digest(nonce), SESSION_TTL)
        record(request, "login")
        return finish(request, RedirectResponse(nxt, 303), Visit(nonce, cookie))

    @router.post("/ui/logout")
    async def logout(request: Request) -> Response:
        """Sign out: a form of the session, with its CSRF token (another site cannot sign the
        operator out); with a token the store revokes the session, so the cookie (or a copy
        of it) is refused from now on."""
        where = "/ui/login?next=/ui" if auth.required else "/ui"
        v = await visit(request)
        if v is None or v.new_cookie is not None:  # no session: nothing to end, nothing set
            return finish(request, RedirectResponse(where, 303), None)
        try:
            await signed_form(request, v)
        except Refused as exc:
            return page(request, v, "message.html", exc.status, error=exc.message)
        if auth.required:
            await runtime.store.sessions.revoke_session(auth.digest(v.nonce))
        record(request, "logout")
        resp = RedirectResponse(where, 303)
        resp.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")
        return finish(request, resp, None)

    # -- actions ---------------------------------------------------------------------------

    def action(fn: Callable[[Request, dict[str, str]], Awaitable[Response]],
               on_error: Callable[[Request, Visit | None, Refused, dict[str, str]],
                                  Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            fields: dict[str, str] = {}
            v = await visit(request)
            try:
                fields = await form(request, v)
                return await fn(request, fields)
            except Refused as exc:
                return await on_error(request, v, exc, fields)

        return handler

    async def back_to_run(request: Request, v: Visit | None, exc: Refused,
                          fields: dict[str, str]) -> Response:
        tid = request.path_params.get("thread_id") or fields.get("thread_id", "")
        if v is None:
            return page(request, None, "message.html", exc.status, error=exc.message)
        try:
            data = await run_data(check_id(tid, "thread_id"))
        except Refused as missing:
            return page(request, v, "message.html", exc.status,
                        error=f"{exc.message} {missing.message}" if exc.status != 404
                        else exc.message)
        return page(request, v, "run.html", exc.status, nav="runs", live="run:" + tid,
                    error=exc.message, typed=fields, **data)

    async def back_to(request: Request, v: Visit | None, exc: Refused,
                      fields: dict[str, str]) -> Response:
        if fields.get("back") == "run":
            return await back_to_run(request, v, exc, fields)
        if v is None:
            return page(request, None, "message.html", exc.status, error=exc.message)
        if request.url.path.startswith("/ui/deployments"):
            return page(request, v, "deployments.html", exc.status, nav="deployments",
                        live="deployments", error=exc.message, typed=fields,
                        **await views.deployments())
        if request.url.path.startswith("/ui/workers"):
            return page(request, v, "workers.html", exc.status, nav="workers", live="workers",
                        error=exc.message, **await views.workers())
        if request.url.path.startswith("/ui/effects"):
            return page(request, v, "effects.html", exc.status, nav="effects", live="effects",
                        error=exc.message, **await effects_data())
        return page(request, v, "inbox.html", exc.status, nav="inbox", live="inbox",
                    error=exc.message, typed=fields, **await inbox_data())

    async def do_cancel(request: Request, fields: dict[str, str]) -> Response:
        tid = check_id(request.path_params["thread_id"], "thread_id")
        try:
            await runtime.cancel(tid, actor=actor)
        except RunNotFound:
            raise Refused(404, f"No run with thread_id {tid!r}; nothing was cancelled.") from None
        record(request, "cancel", thread_id=tid)
        return done(request, f"/ui/runs/{quote(tid, safe='')}", "cancelled")

    async def do_retry_run(request: Request, fields: dict[str, str]) -> Response:
        tid = check_id(request.path_params["thread_id"], "thread_id")
        try:
            await runtime.retry(tid, actor=actor)
        except RunNotFound:
            raise Refused(404, f"No run with thread_id {tid!r}; nothing was retried.") from None
        except InvalidState as exc:
            raise Refused(409, f"{exc}. Nothing was retried.") from None
        record(request, "retry-run", thread_id=tid)
        return done(request, f"/ui/runs/{quote(tid, safe='')}", "run-retried")

    async def do_fork(request: Request, fields: dict[str, str]) -> Response:
        tid = check_id(request.path_params["thread_id"], "thread_id")
        raw = fields.get("step", "").strip()
        if not (raw.isdigit() and raw.isascii() and len(raw) < 16):
            raise Refused(400, f"Step must be a whole number below 10^15, got "
                               f"{raw[:40]!r}; nothing was forked.")
        try:
            new = await runtime.fork(tid, int(raw), actor=actor)
        except RunNotFound:
            raise Refused(404, f"No run with thread_id {tid!r}; nothing was forked.") from None
        except InvalidState as exc:
            raise Refused(409, f"{exc}. Nothing was forked.") from None
        record(request, "fork", thread_id=tid, step=int(raw), new_thread_id=new.thread_id)
        return done(request, f"/ui/runs/{quote(new.thread_id, safe='')}", "forked")

    async def do_resume(request: Request, fields: dict[str, str]) -> Response:
        tid = check_id(fields.get("thread_id"), "thread_id")
        iid = fields.get("interrupt_id") or None
        if iid is not None:
            iid = check_id(iid, "interrupt_id")
        raw = fields.get("value", "")
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise Refused(400, f"Value (JSON) is not valid JSON ({exc}). Nothing was "
                               "answered.") from None
        try:
            await runtime.resume(tid, value, interrupt_id=iid, actor=actor)
        except ResumeConflict as exc:
            raise Refused(409, f"Someone answered first: {exc}. Your answer was not "
                               "recorded.") from None
        except RunNotFound:
            raise Refused(404, f"No run with thread_id {tid!r}; nothing was answered.") from None
        except (InvalidState, SerializationError) as exc:
            raise Refused(409 if isinstance(exc, InvalidState) else 400,
                          f"{exc}. Nothing was answered.") from None
        record(request, "resume", thread_id=tid, interrupt_id=iid)
        if fields.get("back") == "inbox" and await runtime.interrupts(limit=1):
            return done(request, "/ui/interrupts", "resumed")  # on to the next question
        return done(request, f"/ui/runs/{quote(tid, safe='')}", "resumed")

    async def do_retry(request: Request, fields: dict[str, str]) -> Response:
        key = check_id(fields.get("key"), "Effect key")
        tid = check_id(fields.get("thread_id"), "thread_id")
        retried = await runtime.retry_effect(key, tid, actor=actor)
        if not retried:
            raise Refused(409, f"No dead effect {key!r} in run {tid!r} (it may have been "
                               "retried already); nothing was changed.")
        record(request, "retry-effect", thread_id=tid, key=key)
        where = f"/ui/runs/{quote(tid, safe='')}" if fields.get("back") == "run" else "/ui/effects"
        return done(request, where, "retried")

    async def do_route(request: Request, fields: dict[str, str]) -> Response:
        weights = parse_weights(fields)
        await unchanged_if_refused(runtime.route(weights, actor=actor))
        record(request, "route", weights=weights)
        return done(request, "/ui/deployments", "routed")

    async def do_drain(request: Request, fields: dict[str, str]) -> Response:
        version = check_id(fields.get("version"), "Version")
        await unchanged_if_refused(runtime.drain(version, actor=actor))
        record(request, "drain", version=version)
        return done(request, "/ui/deployments", "drained")

    async def do_retire(request: Request, fields: dict[str, str]) -> Response:
        version = check_id(fields.get("version"), "Version")
        await unchanged_if_refused(runtime.retire(version, actor=actor))
        record(request, "retire", version=version)
        return done(request, "/ui/deployments", "retired")

    router.add_api_route("/ui/deployments/route", action(do_route, back_to), methods=["POST"])
    router.add_api_route("/ui/deployments/drain", action(do_drain, back_to), methods=["POST"])
    router.add_api_route("/ui/deployments/retire", action(do_retire, back_to), methods=["POST"])
    router.add_api_route("/ui/runs/{thread_id:path}/cancel", action(do_cancel, back_to_run),
                         methods=["POST"])
    router.add_api_route("/ui/runs/{thread_id:path}/fork", action(do_fork, back_to_run),
                         methods=["POST"])
    router.add_api_route("/ui/runs/{thread_id:path}/retry", action(do_retry_run, back_to_run),
                         methods=["POST"])
    router.add_api_route("/ui/interrupts/resume", action(do_resume, back_to), methods=["POST"])
    router.add_api_route("/ui/effects/retry", action(do_retry, back_to), methods=["POST"])
    add_more_actions(router, runtime, actor, action, back_to_run, back_to, done, record)

    add_pages(router, views, view, page)  # /ui/metrics, /ui/agents/{name}

    @router.get("/ui/{rest:path}")
    @view
    async def unknown(request: Request, v: Visit) -> Response:
        # Last: behind the session like every page, so a stranger learns no path exists.
        raise Refused(404, f"There is no dashboard page at {request.url.path!r}.")

    return router
