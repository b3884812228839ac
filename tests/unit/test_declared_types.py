"""A stored typed value reads back only as a class this process knows: one it wrote, one
tether.register_type() named, or one an annotation declares (a node's state, a journaled
call's return). Nothing is imported because a row names it. Each case runs in a fresh
interpreter, where nothing has been written yet (as after a crash, in a new worker)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

APPS = Path(__file__).resolve().parents[1] / "apps"


def fresh(code: str) -> str:
    """What `code` prints in a new interpreter that can import tests/apps' modules."""
    prelude = f"import sys; sys.path.insert(0, {str(APPS)!r})\n"
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


ORDER = ('{"__tether__":"json","v":{"order":{"__tether__":"dataclass","cls":"typed_values:Order",'
         '"v":{"lines":[{"__tether__":"dataclass","cls":"typed_values:Line","v":{"item":"tea",'
         '"size":{"__tether__":"enum","cls":"typed_values:Size","name":"LARGE"}}}]}}}}')


def test_a_row_naming_a_module_imports_nothing() -> None:
    out = fresh("""
        import sys
        from tether import SerializationError, serde
        for row in (b'{"__tether__":"dataclass","cls":"this:s","v":{}}',
                    b'{"__tether__":"enum","cls":"antigravity:x","name":"A"}',
                    b'{"__tether__":"pydantic","cls":"os:system","v":"id"}'):
            try:
                serde.loads(row)
            except SerializationError as exc:
                print(type(exc).__name__, "|", exc)
        print("this" in sys.modules, "antigravity" in sys.modules)
    """)
    lines = out.splitlines()
    assert len(lines) == 4, out
    for line, name in zip(lines[:3], ("this:s", "antigravity:x", "os:system"), strict=True):
        assert line.startswith("UnknownType | a stored value names class " + repr(name)), line
        assert "tether.register_type()" in line and "never imports" in line
    assert lines[3] == "False False"


def test_an_undeclared_class_is_refused_even_when_loaded() -> None:
    out = fresh(f"""
        from tether import SerializationError, serde
        import typed_values  # loaded, but (without its node) nothing declares Order
        from tether import _declared
        _declared._pending.clear()
        try:
            serde.loads({ORDER!r}.encode())
        except SerializationError as exc:
            print(exc)
    """)
    assert "'typed_values:Order'" in out and "does not know" in out


def test_a_nodes_state_annotation_declares_its_classes() -> None:
    out = fresh(f"""
        from tether import serde
        import typed_values  # its node take(state: OrderState, ...) declares Order, Line, Size
        value = serde.loads({ORDER!r}.encode())
        print(value == {{"order": typed_values.Order([typed_values.Line("tea",
                                                      typed_values.Size.LARGE)])}})
    """)
    assert out == "True"


def test_register_type_allows_a_class_and_the_classes_its_fields_name() -> None:
    out = fresh(f"""
        import dataclasses
        import tether
        from tether import serde
        import typed_values
        typed_values.shop.nodes.clear()
        from tether import _declared
        _declared._pending.clear()  # no node declares anything here
        assert tether.register_type(typed_values.Order) is typed_values.Order
        value = serde.loads({ORDER!r}.encode())
        print(type(value["order"].lines[0].size).__name__)
        try:
            tether.register_type(dataclasses.make_dataclass("Local", ["x"]))
        except TypeError as exc:
            print(exc)
    """)
    first, second = out.splitlines()
    assert first == "Size"
    assert second.startswith("tether.register_type(Local)")


def test_a_replayed_call_is_declared_by_its_functions_return_annotation() -> None:
    out = fresh("""
        from tether import SerializationError
        from tether.context import _replayed
        import typed_values
        row = b'{"__tether__":"dataclass","cls":"typed_values:Receipt","v":{"total":7}}'
        print(_replayed(row, typed_values.make_receipt))
        note = b'{"__tether__":"dataclass","cls":"typed_values:Note","v":{"text":"hi"}}'
        try:
            _replayed(note, typed_values.make_note)  # returns Any: declares nothing
        except SerializationError as exc:
            print(type(exc).__name__)
    """)
    assert out.splitlines() == ["Receipt(total=7)", "UnknownType"]


def test_what_this_process_wrote_reads_back() -> None:
    out = fresh("""
        from tether import serde
        import typed_values
        typed_values.shop.nodes.clear()
        from tether import _declared
        _declared._pending.clear()
        data = serde.dumps(typed_values.Note("x"), "r", typed=True)
        print(serde.loads(data))
    """)
    assert out == "Note(text='x')"
