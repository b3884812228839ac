"""Typed values an app declares three ways (for tests/unit/test_declared_types.py): a node's
state annotation, a journaled call's return annotation, and tether.register_type."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, TypedDict

from tether import Agent, finish


class Size(enum.Enum):
    SMALL = "s"
    LARGE = "l"


@dataclasses.dataclass
class Line:
    item: str
    size: Size


@dataclasses.dataclass
class Order:
    lines: list[Line]


class OrderState(TypedDict):
    order: Order


@dataclasses.dataclass
class Receipt:
    total: int


@dataclasses.dataclass
class Note:
    text: str


def make_receipt(total: int) -> Receipt:
    return Receipt(total)


def make_note(text: str) -> Any:
    return Note(text)


shop = Agent("shop", typed_state=True)


@shop.node
async def take(state: OrderState, ctx: Any) -> Any:
    return finish({"order": state["order"]})
