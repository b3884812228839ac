"""The package's layering, read from the source: no import cycles, no upward imports.

Every import counts, including lazy ones inside functions and those under TYPE_CHECKING: a
cycle that only the type checker sees is still two modules that cannot be understood apart.
A new module must be placed in LAYERS (the test names it otherwise); docs/explanation/
design.md has the same map with a line per module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import tether

SRC = Path(tether.__file__).resolve().parent

# Lowest first. A module may import modules of its own layer or of layers below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("values", ("tether.errors", "tether.serde", "tether.config", "tether.retry", "tether.types",
                "tether.state", "tether.eventloop", "tether.tuning", "tether.extras",
                "tether._typed", "tether._declared", "tether.ids", "tether.llm")),
    ("store", ("tether.store",)),
    ("engine", ("tether.calls", "tether.context", "tether.history", "tether.outbox",
                "tether.agent", "tether.registry", "tether.hub", "tether.deploy",
                "tether.worker", "tether.starting", "tether.waiting",
                "tether.retention", "tether.records", "tether.closing", "tether.leases",
                "tether.worker_records")),
    ("runtime", ("tether.runtime",)),
    ("api", ("tether",)),  # the package itself (only): the public names, re-exported
    ("apps", ("tether.__main__", "tether.service", "tether.cli", "tether.demo", "tether.bench",
              "tether.testing", "tether.langgraph", "tether.advise", "tether.observe")),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in SRC.rglob("*.py")}


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None  # (prefix length, rank)
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module == prefix or (prefix != "tether" and module.startswith(prefix + "."))
            if inside and (
                    best is None or len(prefix) > best[0]):
                best = (len(prefix), rank)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return best[1]


def imports_of(module: str) -> Iterator[tuple[str, int]]:
    """(imported tether module, line) for every import statement in `module`."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return imports_in(path.read_text("utf-8"), package)


def imports_in(source: str, package: str) -> Iterator[tuple[str, int]]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "tether" or alias.name.startswith("tether."):
                    yield _known(alias.name), node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not (target == "tether" or target.startswith("tether.")):
                continue
            for alias in node.names:  # `from . import serde` imports the module tether.serde
                sub = f"{target}.{alias.name}"
                yield (sub if sub in MODULES else _known(target)), node.lineno


def _known(name: str) -> str:
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name


def graph() -> dict[str, set[str]]:
    return {m: {t for t, _ in imports_of(m) if t != m} for m in MODULES}


def test_every_module_is_in_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = [
        f"{module}:{line} imports {target} ({LAYERS[layer_of(target)][0]} is above "
        f"{LAYERS[layer_of(module)][0]})"
        for module in sorted(MODULES) for target, line in imports_of(module)
        if layer_of(target) > layer_of(module)
    ]
    assert upward == []


def test_there_are_no_import_cycles() -> None:
    edges = graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycles.append([*path[path.index(t):], t])
            elif t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_lazy_and_type_checking_imports() -> None:
    """Imports hidden in functions or TYPE_CHECKING blocks count, relative ones resolve, and
    an upward one is caught."""
    code = ("from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from ..runtime import Runtime\n"
            "def f():\n    from .. import worker\n    import tether.hub\n"
            "from .base import Store\n")
    found = {t for t, _ in imports_in(code, "tether.store")}
    assert found == {"tether.runtime", "tether.worker", "tether.hub", "tether.store.base"}
    assert [t for t in found if layer_of(t) > layer_of("tether.store.sqlite")] != []


def test_no_module_or_sql_file_is_over_600_lines() -> None:
    """A module that outgrows 600 lines has more than one job: split it by what it does."""
    files = [*SRC.rglob("*.py"), *SRC.rglob("*.sql")]
    long = {str(p.relative_to(SRC)): n for p in files
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600}
    assert not long, f"over 600 lines: {long}"
