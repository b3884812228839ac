"""POST /runs:batch: a burst of starts in one request (Runtime.start_many)."""

from __future__ import annotations

from fastapi import FastAPI, Response

from ..runtime import Runtime
from .models import RunBatch, RunOut, StartBatchIn


def add_batch_route(app: FastAPI, runtime: Runtime, actor: str,
                    errors: dict[int | str, dict[str, object]]) -> None:
    @app.post("/runs:batch", status_code=201, response_model=RunBatch, tags=["runs"],
              responses={200: {"model": RunBatch, "description": "Every run already existed"},
                         **errors})
    async def start_batch(body: StartBatchIn, response: Response) -> RunBatch:
        """Start up to 10,000 runs at once: every one is checked before any is written, the
        inserts share group commits, and the runs come back in the order asked. Per run, the
        same idempotency key (or thread_id and input) returns the existing run, so the same
        batch sent again starts nothing twice."""
        runs = await runtime.start_many(
            [r.model_dump(exclude_none=True) for r in body.runs], actor=actor)
        if not any(r.created for r in runs):
            response.status_code = 200
        return RunBatch(runs=[RunOut.of(r) for r in runs], created=[r.created for r in runs])
