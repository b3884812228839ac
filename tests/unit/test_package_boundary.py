"""What ships in the wheel (src/tether) is self-contained: it imports nothing from the
checkout (bench/, tests/, examples/) and finds no file through its own path out of the
package. What needs the checkout lives in bench/ and is handed in from there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "tether"
CHECKOUT_PACKAGES = {"bench", "tests", "examples", "apps", "conftest"}
# A path climbing out of the file's own directory: Path(__file__).parents[N] or .parent.parent
CLIMB = re.compile(r"__file__.*(\.parents\[|\.parent\.parent)")


def sources() -> list[Path]:
    found = sorted(SRC.rglob("*.py"))
    assert len(found) > 20  # the package, not an empty directory
    return found


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.lineno, node.args[0].value))
    return out


def test_nothing_in_the_package_imports_from_the_checkout() -> None:
    bad = []
    for path in sources():
        for line, module in imported_modules(ast.parse(path.read_text(), str(path))):
            if module.partition(".")[0] in CHECKOUT_PACKAGES:
                bad.append(f"{path.relative_to(SRC)}:{line} imports {module}")
    assert bad == []


def test_nothing_in_the_package_reads_outside_it() -> None:
    bad = [f"{path.relative_to(SRC)}:{n}: {text.strip()}"
           for path in sources()
           for n, text in enumerate(path.read_text().splitlines(), 1) if CLIMB.search(text)]
    assert bad == []


def test_the_checks_catch_what_they_look_for() -> None:
    tree = ast.parse("import bench.anchors\nfrom examples import x\n"
                     "importlib.import_module('tests.apps')\nfrom .bench import y\n")
    assert [m for _, m in imported_modules(tree)] == ["bench.anchors", "examples", "tests.apps"]
    assert CLIMB.search('RUN = Path(__file__).resolve().parents[3] / "examples"')
    assert not CLIMB.search('SQL = Path(__file__).parent / "sql"')
