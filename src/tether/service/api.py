"""The HTTP API: a FastAPI app over one Runtime.

Every error is a JSON body `{"error": {"type": ..., "message": ...}}`: tether's errors keep
their class name with the status below, bad input is 4xx (422 for a body or parameter that
fails validation, 400 for a bad cursor or unparsable body, 413 for a body over the limit),
and a 5xx means a bug or an unreachable database, never bad input.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match

from .. import __version__
from ..deploy import Deployment
from ..errors import (
    ConfigError,
    RunPruned,
    TetherError,
)
from ..observe.metrics import Metrics
from ..runtime import Runtime
from ..types import RunStatus
from .api_parts import (
    _STATUS,
    _TOO_MANY_STREAMS,
    ApiError,
    _check_json,
    _errors,
    decode_cursor,
    encode_cursor,
)
from .batch import add_batch_route
from .dashboard import dashboard_router
from .events import encode, run_events, run_poller, valid_event_id
from .guard import CLIENT_HEADER, Guard, error_response
from .models import (
    MAX_ID,
    MAX_WAIT,
    NO_NUL,
    CheckpointList,
    CheckpointOut,
    DeploymentList,
    DeploymentOut,
    ForkRun,
    Health,
    InterruptList,
    InterruptOut,
    MessageList,
    MessageOut,
    ResumeRun,
    RunEvent,
    RunOut,
    RunPage,
    RunSummary,
    SendMessage,
    SetWeights,
    StartRun,
    WorkerList,
    WorkerOut,
    sse_schema,
)
from .observe import add_audit_route, add_metrics_route, metrics_available, observing
from .streams import (
    MAX_STREAMS,
    MAX_STREAMS_PER_CLIENT,
    HeldStream,
    StreamSlots,
    TooManyStreams,
    client_of,
)

log = logging.getLogger("tether.service")

MAX_BODY_BYTES = 1 << 20
"""Default request body limit: run inputs and resume values are state, not file uploads."""

_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_CLIENT_PARAMETER = {
    "name": CLIENT_HEADER, "in": "header", "required": True,
    "schema": {"type": "string", "minLength": 1, "examples": ["my-client"]},
    "description": "any name of the client: a write without a JSON body says who sends it, so "
                   "that no web page's plain form can (a bearer token does too)"}


class EventStream(HeldStream):
    media_type = "text/event-stream"


Version = Annotated[str, Path(min_length=1, max_length=MAX_ID, pattern=NO_NUL,
                                description="a version name")]
ThreadId = Annotated[str, Path(min_length=1, max_length=MAX_ID, pattern=NO_NUL,
                               description="the run's thread_id")]


def drain(app: FastAPI) -> None:
    """The server is shutting down: end open event streams (clients reconnect elsewhere)
    instead of holding the shutdown until its timeout."""
    app.state.draining = True


def _deployments(found: list[Deployment]) -> DeploymentList:
    return DeploymentList(deployments=[DeploymentOut(**d.as_dict()) for d in found])


def create_app(
    runtime: Runtime,
    *,
    token: str | None = None,
    worker_concurrency: int | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    events_poll: float = 0.25,
    read_only: bool = False,
    token_name: str | None = None,
    allowed_hosts: Iterable[str] = (),
    api_docs: bool = False,
    max_streams: int = MAX_STREAMS,
    max_streams_per_client: int = MAX_STREAMS_PER_CLIENT,
) -> FastAPI:
    """The HTTP API over `runtime`, and the dashboard under /ui. With `token`, every endpoint
    but /healthz requires `Authorization: Bearer <token>` (the dashboard asks for it once).
    `read_only` refuses every request that would change something. Requests must name this
    server in their Host (loopback names, the address they came in on, `allowed_hosts`; "*"
    for any), and writes must not come from another site's page (tether.service.guard).
    `api_docs` serves /docs and /redoc (pages that load their scripts from a CDN). Event
    streams (the API's and the dashboard's) are capped: `max_streams` open in all and
    `max_streams_per_client` per client address, else 429 (tether.service.streams). With
    `worker_concurrency`, a worker runs inside the server's event loop for the app's lifetime
    (stopped cleanly on shutdown)."""
    if worker_concurrency is not None and worker_concurrency < 1:
        raise ConfigError(f"worker_concurrency must be >= 1, got {worker_concurrency}")
    if max_streams < 1 or max_streams_per_client < 1:
        raise ConfigError(f"max_streams and max_streams_per_client must be >= 1, got "
                          f"{max_streams} and {max_streams_per_client}")
    slots = StreamSlots(max_streams, max_streams_per_client)
    rows = run_poller(events_poll)  # one poller for every event stream
    worker: dict[str, asyncio.Task[None]] = {}
    metrics = Metrics() if metrics_available() else None
    # Who the audit log names for actions over HTTP: the token's name (one token, one name).
    actor = token_name or ("token" if token else "anonymous")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await runtime.open()
        with observing(runtime, metrics):
            async with _lifespan():
                yield

    @contextlib.asynccontextmanager
    async def _lifespan() -> AsyncIterator[None]:
        stop = asyncio.Event()
        if worker_concurrency is not None:
            worker["task"] = asyncio.create_task(
                runtime.work(concurrency=worker_concurrency, stop=stop),
                name="tether-worker")
        try:
            yield
        finally:
            stop.set()
            task = worker.pop("task", None)
            if task is not None:
                grace = runtime.settings.shutdown_grace + 5
                try:
                    await asyncio.wait_for(task, grace)
                except TimeoutError:
                    log.warning("embedded worker did not stop within %.0fs", grace)
                except Exception:
                    log.exception("embedded worker failed")
            await rows.close()
            await runtime.close()

    app = FastAPI(
        title="tether",
        version=__version__,
        description="Durable runs of agents: start, inspect, resume, cancel, fork, follow.",
        lifespan=lifespan,
        generate_unique_id_function=lambda route: route.name,
        # Swagger UI and ReDoc load their scripts from a CDN, with no integrity check: off
        # unless asked for. /openapi.json is served either way.
        docs_url="/docs" if api_docs else None,
        redoc_url="/redoc" if api_docs else None,
    )
    app.add_middleware(Guard, token=token or None, max_body=max_body_bytes, read_only=read_only,
                       allowed_hosts=tuple(allowed_hosts), routes=app.router.routes)
    app.state.draining = False
    app.state.streams = slots
    app.state.run_poller = rows
    add_metrics_route(app, runtime, metrics)
    add_audit_route(app, runtime)

    # -- errors ----------------------------------------------------------------------------

    @app.exception_handler(TetherError)
    async def tether_error(request: Request, exc: Exception) -> JSONResponse:
        status = next(code for cls, code in _STATUS if isinstance(exc, cls))
        if status >= 500:
            log.warning("%s %s: %r", request.method, request.url.path, exc)
        if isinstance(exc, RunPruned):  # gone for good, and since when
            return JSONResponse({"error": {"type": "RunPruned", "message": str(exc),
                                           "pruned_at": exc.pruned_at}}, status_code=410)
        return error_response(status, type(exc).__name__, str(exc))

    @app.exception_handler(TooManyStreams)
    async def too_many_streams(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, TooManyStreams)
        return error_response(exc.status, exc.type, exc.message, headers=exc.headers)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.type, exc.message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        details = [
            {"loc": [p if isinstance(p, int) else str(p) for p in e.get("loc", ())],
             "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]
        summary = "; ".join(
            f"{'.'.join(str(p) for p in d['loc'])}: {d['msg']}" for d in details[:5])
        return error_response(422, "ValidationError", summary or "invalid request",
                              details=details)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        phrase = HTTPStatus(exc.status_code).phrase
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette lists only the first route whose path matched; a path served by
            # several routes (GET and POST /runs) allows all of their methods.
            allowed: set[str] = set()
            for route in app.router.routes:
                if route.matches(request.scope)[0] != Match.NONE:
                    allowed |= getattr(route, "methods", None) or set()
            headers["Allow"] = ", ".join(sorted(allowed))
        return error_response(exc.status_code, phrase.replace(" ", ""), str(exc.detail),
                              headers=headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(500, "InternalError", "internal server error")

    # -- runs ------------------------------------------------------------------------------

    @app.post(
        "/runs", status_code=201, response_model=RunOut, tags=["runs"],
        responses={200: {"model": RunOut, "description": "The run already existed (same "
                         "Idempotency-Key, or same thread_id and input)"},
                   **_errors(400, 401, 409, 413, 422)},
    )
    async def start_run(
        body: StartRun,
        response: Response,
        idempotency_key: Annotated[str | None, Header(
            alias="Idempotency-Key", min_length=1, max_length=MAX_ID,
            description="the same key returns the same run instead of starting another",
        )] = None,
        traceparent: Annotated[str | None, Header(
            max_length=128,
            description="W3C trace context: the run's trace becomes a child of this span",
        )] = None,
    ) -> RunOut:
        """Start a run (a worker picks it up)."""
        _check_json(body.input, "input")
        run = await runtime.start(body.agent, body.input, thread_id=body.thread_id,
                                  idempotency_key=idempotency_key, version=body.version,
                                  actor=actor,
                                  traceparent=traceparent)
        if not run.created:
            response.status_code = 200
        return RunOut.of(run)

    add_batch_route(app, runtime, actor, _errors(400, 401, 409, 413, 422))

    @app.get("/runs", response_model=RunPage, tags=["runs"], responses=_errors(400, 401, 422))
    async def list_runs(
        status: Annotated[RunStatus | None, Query(description="only runs in this status")] = None,
        agent: Annotated[str | None, Query(min_length=1, max_length=MAX_ID, pattern=NO_NUL,
                                           description="only runs of this agent")] = None,
        version: Annotated[str | None, Query(min_length=1, max_length=MAX_ID, pattern=NO_NUL,
                                             description="only runs of this version")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        cursor: Annotated[str | None, Query(max_length=1024,
                                            description="next_cursor of the previous page")] = None,
    ) -> RunPage:
        """Runs, newest first, without their state; cursor-paginated."""
        before = decode_cursor(cursor) if cursor else None
        runs = await runtime.list_runs(status=status.value if status else None, agent=agent,
                                       version=version, limit=limit + 1, before=before)
        page = runs[:limit]
        more = len(runs) > limit
        return RunPage(runs=[RunSummary.of(r) for r in page],
                       next_cursor=encode_cursor(page[-1].created_at, page[-1].thread_id)
                       if more else None)

    @app.get("/runs/{thread_id}", response_model=RunOut, tags=["runs"],
             responses=_errors(401, 404, 422))
    async def get_run(
        thread_id: ThreadId,
        wait: Annotated[float | None, Query(
            gt=0, le=MAX_WAIT, description="long-poll: answer once the run is finished (or in "
            "an `until` status), or after this many seconds, whichever comes first")] = None,
        until: Annotated[list[RunStatus] | None, Query(
            description="with `wait`: also answer as soon as the run is in this status "
                        "(repeatable)")] = None,
    ) -> RunOut:
        """One run with its current state; with `wait`, a long-poll (the run as it is when
        the wait ends: check its `status`)."""
        if until and wait is None:
            raise ApiError(422, "ValidationError", "until: needs wait (the seconds to wait)")
        if wait is not None:
            await runtime.peek(thread_id)  # RunNotFound: a 404 at once
            with contextlib.suppress(TimeoutError):
                await runtime.wait(thread_id, timeout=wait,
                                   until=[u.value for u in until] if until else None)
        return RunOut.of(await runtime.get(thread_id))

    @app.post("/runs/{thread_id}/resume", response_model=InterruptOut, tags=["runs"],
              responses=_errors(400, 401, 404, 409, 413, 422))
    async def resume_run(thread_id: ThreadId, body: ResumeRun) -> InterruptOut:
        """Answer the run's pending interrupt (exactly once: a second answer is a 409)."""
        _check_json(body.value, "value")
        rec = await runtime.resume(thread_id, body.value, interrupt_id=body.interrupt_id,
                                   actor=actor)
        return InterruptOut.of(rec)

    @app.post("/runs/{thread_id}/cancel", response_model=RunOut, tags=["runs"],
              responses=_errors(401, 404, 422))
    async def cancel_run(thread_id: ThreadId) -> RunOut:
        """Cancel the run now (a finished run is returned unchanged)."""
        return RunOut.of(await runtime.cancel(thread_id, actor=actor))

    @app.post("/runs/{thread_id}/retry", response_model=RunOut, tags=["runs"],
              responses=_errors(401, 404, 409, 422))
    async def retry_run(thread_id: ThreadId) -> RunOut:
        """Run a failed run again from its failed step (same thread_id, a new attempt); 409
        unless it is failed."""
        return RunOut.of(await runtime.retry(thread_id, actor=actor))

    @app.get("/runs/{thread_id}/checkpoints", response_model=CheckpointList, tags=["runs"],
             responses=_errors(401, 404, 422))
    async def list_checkpoints(
        thread_id: ThreadId,
        state: Annotated[bool, Query(description="include the state after each step")] = True,
    ) -> CheckpointList:
        """The run's checkpoint log, by step."""
        cps = await runtime.checkpoints(thread_id)
        return CheckpointList(checkpoints=[CheckpointOut.of(cp, state) for cp in cps])

    @app.post("/runs/{thread_id}/fork", status_code=201, response_model=RunOut, tags=["runs"],
              responses=_errors(400, 401, 404, 409, 413, 422))
    async def fork_run(thread_id: ThreadId, body: ForkRun) -> RunOut:
        """A new run starting from the state after `step` of this one."""
        return RunOut.of(await runtime.fork(thread_id, body.step, new_thread_id=body.thread_id,
                                            actor=actor))

    @app.post("/runs/{thread_id}/messages", status_code=201, response_model=MessageOut,
              tags=["messages"], responses=_errors(400, 401, 404, 409, 413, 422))
    async def send_message(thread_id: ThreadId, body: SendMessage) -> MessageOut:
        """Put a message in the run's mailbox (waking it if it is idle, waiting for mail); 409
        for a finished run, which could never read it."""
        _check_json(body.message, "message")
        mid = await runtime.send(thread_id, body.message, sender=body.sender, actor=actor)
        return MessageOut(id=mid, thread_id=thread_id, sender=body.sender, message=body.message)

    @app.get("/runs/{thread_id}/messages", response_model=MessageList, tags=["messages"],
             responses=_errors(401, 404, 422))
    async def list_messages(thread_id: ThreadId) -> MessageList:
        """The run's mailbox: messages not yet consumed by a committed step, oldest first."""
        await runtime.peek(thread_id)  # RunNotFound: a 404
        msgs = await runtime.inbox(thread_id)
        return MessageList(messages=[
            MessageOut(id=m.id, thread_id=thread_id, sender=m.sender, message=m.body,
                       created_at=m.created_at) for m in msgs])

    @app.get(
        "/runs/{thread_id}/events", response_class=EventStream, tags=["runs"],
        responses={200: {"description": "Server-Sent Events: status, step, interrupted, "
                         "resumed, sleeping, stream, then one of completed, failed, cancelled",
                         "content": {"text/event-stream": {"schema": sse_schema()}}},
                   429: _TOO_MANY_STREAMS, **_errors(400, 401, 404, 422, explicit=True)},
    )
    async def follow_run(
        request: Request,
        thread_id: ThreadId,
        last_event_id: Annotated[str | None, Header(
            alias="Last-Event-ID", max_length=8192,
            description="the `id` of the last event received: the stream resumes after it "
                        "(only the events missed, no new `status` event)")] = None,
    ) -> EventStream:
        """Follow the run: an initial `status` event, then its events until it is finished.
        Every event has an SSE `id`; a reconnect with `Last-Event-ID` resumes after it. 429
        past the server's caps on open streams (per client and in all)."""
        if last_event_id is not None and not valid_event_id(last_event_id):
            raise ApiError(400, "InvalidEventId",
                           "Last-Event-ID is not the id of an event this server sent")
        rec = await runtime.peek(thread_id)  # RunNotFound: a 404 before the stream starts
        slot = slots.acquire(client_of(request.scope))  # TooManyStreams: a 429

        async def frames() -> AsyncIterator[bytes]:
            async for ev in run_events(runtime, rec, poll=events_poll, poller=rows,
                                       draining=lambda: app.state.draining,
                                       after=last_event_id):
                yield encode(ev)

        return EventStream(frames(), slot=slot, headers={"Cache-Control": "no-cache",
                                                         "X-Accel-Buffering": "no"})

    # -- interrupts, health ----------------------------------------------------------------

    @app.get("/interrupts", response_model=InterruptList, tags=["interrupts"],
             responses=_errors(401, 422))
    async def list_interrupts(
        thread_id: Annotated[str | None, Query(min_length=1, max_length=MAX_ID, pattern=NO_NUL,
                                               description="only this run's")] = None,
        status: Annotated[str, Query(pattern="^(pending|resolved|all)$",
                                     description="pending (default), resolved or all")] = "pending",
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> InterruptList:
        """Interrupts waiting for a person (oldest first): the inbox to answer."""
        recs = await runtime.interrupts(thread_id=thread_id,
                                        status=None if status == "all" else status, limit=limit)
        return InterruptList(interrupts=[InterruptOut.of(i) for i in recs])

    # -- deployments and workers -----------------------------------------------------------

    @app.get("/workers", response_model=WorkerList, tags=["deployments"],
             responses=_errors(401))
    async def list_workers() -> WorkerList:
        """Registered workers with their last heartbeat (dead ones: alive false)."""
        return WorkerList(workers=[WorkerOut(**w.as_dict()) for w in await runtime.workers()])

    @app.get("/deployments", response_model=DeploymentList, tags=["deployments"],
             responses=_errors(401))
    async def list_deployments() -> DeploymentList:
        """Per version: weight, state, live workers, open runs by status, stranded runs."""
        return _deployments(await runtime.deployments())

    @app.put("/deployments", response_model=DeploymentList, tags=["deployments"],
             responses=_errors(400, 401, 409, 422))
    async def route(body: SetWeights) -> DeploymentList:
        """Set the weights of new runs (the whole table; a version not named gets 0)."""
        return _deployments(await runtime.route(body.weights, actor=actor))

    @app.post("/deployments/{version}/drain", response_model=DeploymentOut,
              tags=["deployments"], responses=_errors(401, 409, 422))
    async def drain(version: Version) -> DeploymentOut:
        """Weight 0 for the version: its open runs finish on it, no new run lands on it."""
        return DeploymentOut(**(await runtime.drain(version, actor=actor)).as_dict())

    @app.post("/deployments/{version}/retire", response_model=DeploymentOut,
              tags=["deployments"], responses=_errors(401, 409, 422))
    async def retire(version: Version) -> DeploymentOut:
        """Retire a drained version: it never takes a run again (409 while it has weight or
        open runs; 422 for a version never seen)."""
        return DeploymentOut(**(await runtime.retire(version, actor=actor)).as_dict())

    @app.get("/healthz", response_model=Health, response_model_exclude_unset=True,
             tags=["health"],
             responses={503: {"model": Health, "description": "database or worker down"}})
    async def healthz(request: Request, response: Response) -> Health:
        """Liveness and database check (no token needed). Without the token (or, on a server
        without one, under a Host that is not this server's) only `status`: ok or
        unavailable; the details (whose database errors name its user, host and database)
        need the token."""
        error: str | None = None
        try:
            await runtime.ping()
        except Exception as exc:
            error = f"database: {exc}"
        task = worker.get("task")
        if task is not None and task.done():
            error = error or "embedded worker stopped"
        stranded = 0
        if error is None:
            try:
                stranded = sum(d.stranded for d in await runtime.deployments())
            except Exception as exc:
                error = f"database: {exc}"
        if error is not None:
            response.status_code = 503
        if not request.scope.get("state", {}).get("tether_authorized", False):
            return Health(status="unavailable" if error else "ok")
        return Health(status="unavailable" if error else "stranded" if stranded else "ok",
                      db=runtime.dialect, version=runtime.version, worker=task is not None,
                      stranded=stranded, error=error)

    # -- OpenAPI ---------------------------------------------------------------------------

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components["RunEvent"] = RunEvent.model_json_schema(
                ref_template="#/components/schemas/{model}")
            # The guard's answers to any write (tether.service.guard): another site's page
            # or --read-only (403), a body neither JSON nor sent by a named client (415).
            guarded = _errors(403, 415, explicit=True)
            for path, operations in schema["paths"].items():
                for method, operation in operations.items():
                    # Any route but /healthz: no or a wrong token (401), a Host not this
                    # server's (403); a run's routes: unknown (404) or pruned (410) run.
                    errors = operation["responses"]
                    if path != "/healthz":
                        for code, entry in _errors(401, 403, explicit=True).items():
                            errors.setdefault(str(code), entry)
                    if "{thread_id}" in path:
                        for code, entry in _errors(404, 410, explicit=True).items():
                            errors.setdefault(str(code), entry)
                    if method.upper() not in _WRITES:
                        continue
                    for code, entry in guarded.items():
                        operation["responses"].setdefault(str(code), entry)
                    if "requestBody" not in operation:
                        operation.setdefault("parameters", []).append(_CLIENT_PARAMETER)
            for name in ("StartRun", "StartBatchItem"):
                start = components.get(name)
                if start is not None and runtime.agents:
                    start["properties"]["agent"]["enum"] = sorted(runtime.agents)
            if token:
                schema.setdefault("components", {})["securitySchemes"] = {
                    "bearer": {"type": "http", "scheme": "bearer"}}
                schema["security"] = [{"bearer": []}]
                schema["paths"]["/healthz"]["get"]["security"] = []
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    # The dashboard's actions name the token's too; without a token, "dashboard". Its 27
    # routes (all under /ui) come after the API's: a request is matched against the routes
    # in order, and a burst of POST /runs then finds its route first.
    app.include_router(dashboard_router(runtime, token=token or None, read_only=read_only,
                                        actor=actor if token else "dashboard",
                                        draining=lambda: app.state.draining,
                                        slots=slots))
    return app
