"""Request and response bodies of the HTTP API (pydantic lives here and nowhere else)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

from ..ids import THREAD_ID_PATTERN, THREAD_ID_RULE
from ..types import Checkpoint, Interrupt, Run, RunStatus

MAX_ID = 200
"""thread_id, agent name and idempotency key: the limits runtime.start enforces."""
MAX_INTERRUPT_ID = 300
"""Interrupt ids are `thread_id:step:index`."""
MAX_WAIT = 60.0
"""The longest long-poll (GET /runs/{thread_id}?wait=S): below the idle timeouts of proxies."""
NO_NUL = r"^[^\x00]+$"
"""Postgres TEXT cannot hold NUL; rejecting it here keeps a bad id a 422, not a 500."""

Id = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID, pattern=NO_NUL)]


def _thread_id(value: str) -> str:
    if re.search(THREAD_ID_PATTERN, value) is None:
        raise ValueError(f"a thread_id is {THREAD_ID_RULE}")
    return value


ThreadId = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID),
                     AfterValidator(_thread_id),
                     Field(json_schema_extra={"pattern": THREAD_ID_PATTERN})]
"""A new run's thread_id: no '/' (it would be unreachable under /runs/{thread_id}/...)."""
InterruptId = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_INTERRUPT_ID, pattern=NO_NUL)
]


def _json_int(value: Any) -> Any:
    """JSON Schema's integer: 3 and 3.0, but neither true nor "3"."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("must be an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("must be an integer")
        return int(value)
    return value


Step = Annotated[int, Field(ge=0, le=10**15), BeforeValidator(_json_int)]
"""Below 2**53, so that JSON tools that read numbers as doubles see the exact bound."""


MAX_WEIGHT = 999_999_999
"""The store keeps a weight in a 64-bit integer; a bound well inside it keeps 10**30 a 422."""
Weight = Annotated[int, Field(ge=0, le=MAX_WEIGHT)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StartRun(_In):
    agent: Id = Field(description="name of one of the app's agents")
    input: dict[str, Any] = Field(default_factory=dict, description="the run's initial state")
    thread_id: ThreadId | None = Field(
        default=None,
        description="the run's id (default: a new uuid); the same thread_id with the same "
        "input returns the existing run",
    )
    version: Id | None = Field(
        default=None,
        description="the code version to run it on (a version a worker registered); default: "
        "the deployment weights' choice for its thread_id, else the server's own version",
    )


class ResumeRun(_In):
    value: Any = Field(description="the answer (any JSON value), returned by ctx.interrupt()")
    interrupt_id: InterruptId | None = Field(
        default=None, description="the interrupt to answer (default: the run's pending one)"
    )


class ForkRun(_In):
    step: Step = Field(description="the step whose state the new run starts from")
    thread_id: ThreadId | None = Field(default=None,
                                       description="the new run's id (default: new uuid)")


class SendMessage(_In):
    message: Any = Field(description="the message (any JSON value), delivered in ctx.inbox")
    sender: Id | None = Field(default=None, description="who sent it (default: none)")


class MessageOut(BaseModel):
    id: int = Field(description="the message id; ids increase in send order")
    thread_id: str = Field(description="the recipient run")
    sender: str | None
    message: Any
    created_at: float | None = Field(default=None, description="when it was stored (list only)")


class MessageList(BaseModel):
    messages: list[MessageOut] = Field(description="unconsumed messages, oldest first")


class ErrorDetail(BaseModel):
    type: str = Field(description="the error class, e.g. RunNotFound, ValidationError")
    message: str
    details: list[dict[str, Any]] | None = Field(
        default=None, description="per-field problems of a ValidationError"
    )


class ErrorBody(BaseModel):
    error: ErrorDetail


class RunErrorOut(BaseModel):
    category: str
    type: str
    message: str
    traceback: str
    node: str | None = Field(None, description="the node whose step raised")


class RunSummary(BaseModel):
    thread_id: str
    agent: str
    status: RunStatus
    step: int
    version: str
    node: str | None
    attempt: int
    error: RunErrorOut | None
    created_at: float
    updated_at: float
    idempotency_key: str | None
    parent_thread_id: str | None
    forked_from: str | None
    forked_step: int | None
    lease_owner: str | None
    wake_at: float | None
    waiting_for: str | None = Field(
        None, description="What a waiting run waits for: interrupt, mail or join")
    actor_state: str | None = Field(
        None, description="For actors: idle (parked for mail) or processing")
    failed_node: str | None = Field(
        None, description="The node whose step failed (null unless the run failed)")
    inbox_depth: int | None = Field(None, description="Unconsumed messages (single-run reads)")
    usage: dict[str, int] | None = Field(
        None, description="LLM token usage summed over the run's journaled calls, each counted "
                          "once (input_tokens, output_tokens, ...; single-run reads)")

    @classmethod
    def of(cls, run: Run) -> RunSummary:
        d = run.to_dict()
        d.pop("state")
        return cls.model_validate(d)


class RunOut(RunSummary):
    state: dict[str, Any]

    @classmethod
    def of(cls, run: Run) -> RunOut:
        return cls.model_validate(run.to_dict())


class StartBatchItem(StartRun):
    idempotency_key: Id | None = Field(
        default=None, description="the same key returns the same run instead of starting another")


class StartBatchIn(_In):
    runs: list[StartBatchItem] = Field(
        min_length=1, max_length=10_000,
        description="the runs to start, 1 to 10,000, each as POST /runs takes it (with its "
                    "idempotency key in `idempotency_key`); checked before any is written")


class RunBatch(BaseModel):
    runs: list[RunOut] = Field(description="the runs, in the order asked")
    created: list[bool] = Field(description="per run: started now (false: it existed, by its "
                                            "idempotency key or its thread_id and input)")


class RunPage(BaseModel):
    runs: list[RunSummary]
    next_cursor: str | None = Field(
        description="pass as `cursor` to get the next page; null on the last page"
    )


class CheckpointOut(BaseModel):
    thread_id: str
    step: int
    node: str
    next_node: str | None
    state: dict[str, Any] | None = Field(description="the state after this step")
    kind: str = Field(description="s: snapshot, d: delta")
    worker: str
    attempt: int
    started_at: float
    finished_at: float
    duration: float

    @classmethod
    def of(cls, cp: Checkpoint, with_state: bool) -> CheckpointOut:
        d = cp.to_dict()
        if not with_state:
            d["state"] = None
        return cls.model_validate(d)


class InterruptOut(BaseModel):
    id: str
    thread_id: str
    step: int
    payload: Any = Field(description="what the run asked (ctx.interrupt's argument)")
    status: str = Field(description="pending or resolved")
    value: Any = Field(description="the answer, once resolved")
    created_at: float
    resolved_at: float | None

    @classmethod
    def of(cls, i: Interrupt) -> InterruptOut:
        return cls.model_validate(i.to_dict())


class Health(BaseModel):
    """Only `status` (ok or unavailable) without the token; every field with it."""

    status: Literal["ok", "stranded", "unavailable"]
    db: str | None = Field(default=None, description="the database dialect")
    version: str | None = Field(default=None, description="the code version this server runs")
    worker: bool | None = Field(default=None,
                                description="whether a worker runs inside this server")
    stranded: int | None = Field(default=None, description="open runs whose version has had "
                                 "no live worker for longer than the lease TTL (status "
                                 "`stranded` when > 0)")
    error: str | None = None


class WorkerOut(BaseModel):
    id: str
    host: str
    pid: int
    version: str
    agents: dict[str, list[str]] = Field(description="agent -> node names, the start node first")
    concurrency: int
    busy: int = Field(description="slots in use at its last heartbeat")
    lease_ttl: float
    started_at: float
    last_seen: float = Field(description="its last heartbeat (database clock)")
    alive: bool = Field(description="false once a lease TTL passed without a heartbeat")


class WorkerList(BaseModel):
    workers: list[WorkerOut]


class DeploymentOut(BaseModel):
    version: str
    weight: int
    state: Literal["active", "draining", "drained", "retired"]
    workers: int = Field(description="live workers of this version")
    runs: dict[str, int] = Field(description="open runs by status")
    open: int
    oldest_open: float | None = Field(description="when its oldest open run was created")
    stranded: int
    retired_at: float | None


class DeploymentList(BaseModel):
    deployments: list[DeploymentOut]


class SetWeights(BaseModel):
    """The whole weight table of new runs: a version not named gets weight 0."""

    model_config = ConfigDict(extra="forbid", strict=True)

    weights: dict[Id, Weight] = Field(description="version -> weight, integers >= 0 summing to "
                                   "more than 0", examples=[{"v1": 90, "v2": 10}])


class CheckpointList(BaseModel):
    checkpoints: list[CheckpointOut]


class InterruptList(BaseModel):
    interrupts: list[InterruptOut]


EVENT_TYPES = ("status", "step", "interrupted", "resumed", "sleeping", "stream", "processing",
               "response", "idle", "completed", "failed", "cancelled")


class RunEvent(BaseModel):
    """The JSON `data` of one Server-Sent Event of GET /runs/{thread_id}/events; its SSE
    `event` name is the same as `type`. Further fields depend on the type."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="one of: " + ", ".join(EVENT_TYPES))
    thread_id: str
    step: int | None = Field(default=None, description="the step it concerns")


def sse_schema() -> dict[str, Any]:
    """OpenAPI (3.1) schema of one event of the stream, with its JSON data described."""
    return {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"type": "string", "description": "the event type (= data.type)"},
            "data": {"type": "string", "contentMediaType": "application/json",
                     "contentSchema": {"$ref": "#/components/schemas/RunEvent"}},
        },
    }
