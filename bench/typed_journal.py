"""What a journaled result costs to encode (first execution) and decode (replay), per kind of
result: `python -m bench.typed_journal [--out FILE]`.

A pydantic result must cost one model_dump_json and one model_validate_json when recorded
(the first execution gets the validated copy a replay would get) and one model_validate_json
when replayed, and little else: the table puts serde's time beside pydantic's own. Plain
results must cost what they did before typed results existed: the table puts serde's time
beside bare orjson (one dumps, one loads, the comparison serde made already).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import platform
import sys
import timeit
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import orjson
import pydantic

from tether import serde


class Function(pydantic.BaseModel):
    name: str
    arguments: str


class ToolCall(pydantic.BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: Function


class Message(pydantic.BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class Choice(pydantic.BaseModel):
    index: int
    finish_reason: str
    message: Message


class Usage(pydantic.BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(pydantic.BaseModel):
    """The shape of OpenAI's ChatCompletion (a chat answer with one tool call)."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


@dataclasses.dataclass(frozen=True)
class Fetched:
    url: str
    at: datetime.datetime
    id: uuid.UUID
    body: bytes


def completion() -> ChatCompletion:
    return ChatCompletion(
        id="chatcmpl-123", created=1_764_579_600, model="gpt-4o-mini",
        choices=[Choice(index=0, finish_reason="tool_calls", message=Message(
            content="Let me look that up. " * 10,
            tool_calls=[ToolCall(id="call_1", function=Function(
                name="search", arguments='{"query": "durable execution"}'))]))],
        usage=Usage(prompt_tokens=120, completion_tokens=40, total_tokens=160))


PLAIN: dict[str, Any] = {
    "str (W2's result)": "reply " * 8,
    "small dict": {"answer": "yes", "score": 0.93, "tags": ["a", "b"]},
    "1 KB nested": {"choices": [{"index": i, "text": "token " * 20, "logprobs": None}
                                for i in range(8)], "usage": {"total": 160}},
}


def per_call_us(fn: Callable[[], object], number: int) -> float:
    """Best of 5 repeats, microseconds per call."""
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def counted(model: type[pydantic.BaseModel]) -> dict[str, int]:
    """Count model_dump_json / model_validate_json calls on every class of the model."""
    counts = {"dump": 0, "validate": 0}
    for cls in (model, *[c for c in (Function, ToolCall, Message, Choice, Usage)]):
        dump, validate = cls.model_dump_json, cls.model_validate_json.__func__  # type: ignore[attr-defined]

        def dump_(self: Any, _dump: Any = dump, **kw: Any) -> str:
            counts["dump"] += 1
            return _dump(self, **kw)  # type: ignore[no-any-return]

        def validate_(cls_: Any, data: Any, _validate: Any = validate, **kw: Any) -> Any:
            counts["validate"] += 1
            return _validate(cls_, data, **kw)

        cls.model_dump_json = dump_  # type: ignore[method-assign]
        cls.model_validate_json = classmethod(validate_)  # type: ignore[method-assign,assignment]
    return counts


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.typed_journal")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = parser.parse_args(argv)
    rows: list[tuple[str, str, str, str]] = []

    for name, value in PLAIN.items():
        data = orjson.dumps(value)
        bare = per_call_us(lambda v=value: orjson.loads(orjson.dumps(v)) == v, 20_000)
        enc = per_call_us(lambda v=value: serde.encode(v, "r", typed=True), 20_000)
        dec = per_call_us(lambda d=data: serde.loads(d), 20_000)
        bare_loads = per_call_us(lambda d=data: orjson.loads(d), 20_000)
        rows.append((name, f"{enc:.2f}", f"{dec:.2f}",
                     f"orjson dumps+loads+compare {bare:.2f}, loads {bare_loads:.2f}"))

    value = completion()
    data = serde.dumps(value, typed=True)
    dump_opts = {"by_alias": True, "round_trip": True}
    text = value.model_dump_json(**dump_opts)
    pyd_dump = per_call_us(lambda: value.model_dump_json(**dump_opts), 5_000)
    pyd_validate = per_call_us(lambda: ChatCompletion.model_validate_json(text), 5_000)
    enc = per_call_us(lambda: serde.encode(value, "r", typed=True), 5_000)
    dec = per_call_us(lambda: serde.loads(data), 5_000)
    rows.append(("pydantic ChatCompletion", f"{enc:.2f}", f"{dec:.2f}",
                 f"model_dump_json {pyd_dump:.2f} + model_validate_json {pyd_validate:.2f}"
                 f" = {pyd_dump + pyd_validate:.2f}"))

    fetched = Fetched("https://example.invalid", datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC),
                      uuid.UUID(int=1), b"\x00" * 64)
    fdata = serde.dumps(fetched, typed=True)
    rows.append(("dataclass (datetime, UUID, bytes)",
                 f"{per_call_us(lambda: serde.encode(fetched, 'r', typed=True), 5_000):.2f}",
                 f"{per_call_us(lambda: serde.loads(fdata), 5_000):.2f}", ""))

    counts = counted(ChatCompletion)
    serde.encode(value, "r", typed=True)
    recorded = dict(counts)
    serde.loads(data)
    replayed = {k: counts[k] - recorded[k] for k in counts}

    lines = [
        f"# Journal encoding: cost per result (python {platform.python_version()},"
        f" pydantic {pydantic.VERSION}, orjson {orjson.__version__})",
        "",
        "| result | record (encode) us | replay (loads) us | for comparison, us |",
        "| --- | ---: | ---: | --- |",
        *[f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows],
        "",
        f"pydantic calls when a ChatCompletion is recorded: {recorded['dump']} model_dump_json,"
        f" {recorded['validate']} model_validate_json; when it is replayed:"
        f" {replayed['dump']} model_dump_json, {replayed['validate']} model_validate_json"
        " (nested models are dumped and validated by their parent, not called again).",
    ]
    table = "\n".join(lines) + "\n"
    sys.stdout.write(table)
    if args.out:
        args.out.write_text(table)
    return 0 if recorded == {"dump": 1, "validate": 1} and replayed == {"dump": 0, "validate": 1} else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
