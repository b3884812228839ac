"""scripts/langgraph-suite's reading of pytest's results: a timing-sensitive test that fails is
run again once alone (retried when it passes then); any other failure stands."""

from __future__ import annotations

import os
from pathlib import Path

from bench.langgraph_suite import _node_id, run_one, table

FLAKY = '''
from pathlib import Path

def test_imp_nested(tmp_path_factory):
    marker = Path(__file__).with_name("ran-once")
    if not marker.exists():
        marker.write_text("1")
        raise AssertionError("first run fails, as under load")

def test_stream_subgraphs_during_execution():
    raise AssertionError("fails every time")

def test_other():
    raise AssertionError("not timing-sensitive")

def test_fine():
    pass
'''


def test_timing_failures_retried_once_others_stand(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "tests").mkdir(parents=True)
    (src / "tests" / "__init__.py").write_text("")
    (src / "tests" / "test_flaky.py").write_text(FLAKY)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = run_one("memory", src, work, env, ["-p", "no:xdist"])
    assert (result.passed, result.retried) == (1, 1)
    assert sorted(result.failures) == [
        "tests/test_flaky.py::test_other",
        "tests/test_flaky.py::test_stream_subgraphs_during_execution"]
    assert result.failed == 2
    assert "retried" in table([result]).splitlines()[0]


def test_node_id_from_junit_names(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("")
    assert _node_id(tmp_path, "tests.test_x", "test_a[p-1]") == "tests/test_x.py::test_a[p-1]"
    assert _node_id(tmp_path, "tests.test_x.TestY", "test_b") == "tests/test_x.py::TestY::test_b"
    assert _node_id(tmp_path, "nowhere.mod", "t") == "nowhere.mod::t"
