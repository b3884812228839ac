"""The `tether` command in subprocesses (`python -m tether`), on every store: migrate, runs
start/list/show, checkpoints, a background worker stopped with SIGTERM, and the errors a user
meets first (bad --app, bad --db, unmigrated database)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

APP = textwrap.dedent(
    """
    import asyncio

    import tether

    greeter = tether.Agent("greeter")


    @greeter.node(start=True)
    async def hello(state, ctx):
        return tether.goto(
            "bye", {"greeting": "hello " + state["name"], "log": tether.append(["hello"])}
        )


    @greeter.node
    async def bye(state, ctx):
        return tether.finish({"log": tether.append(["bye"])})


    slow = tether.Agent("slow")


    @slow.node(start=True)
    async def wait_long(state, ctx):
        await asyncio.sleep(120)
        return tether.finish({"never": True})


    flaky = tether.Agent("flaky", retry=tether.RetryPolicy(attempts=1))


    @flaky.node(start=True)
    async def needs_fix(state, ctx):
        import os
        if not os.path.exists("fixed"):
            raise RuntimeError("not fixed yet")
        return tether.finish({"fixed": True})


    asker = tether.Agent("asker")


    @asker.node(start=True)
    async def ask(state, ctx):
        return tether.finish({"answer": ctx.interrupt({"question": "go?"})})


    runtime = tether.Runtime(agents=[greeter, slow, flaky, asker])
    not_a_runtime = greeter
    number = 42


    def make_runtime():
        return tether.Runtime(agents=[greeter, slow, flaky, asker])


    def needs_args(a, b):
        return a + b
    """
)

TIMEOUT = 60.0


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "badsyntax.py").write_text("def (:\n")
    return tmp_path


def cli_env(db: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    if db is not None:
        env["TETHER_DB"] = db
    env.update({"TETHER_SHUTDOWN_GRACE": "1", "TETHER_POLL_INTERVAL": "0.05", "COLUMNS": "250",
                "PYTHONUNBUFFERED": "1", **extra})
    return env


def tether(
    *args: str, cwd: Path, env: dict[str, str], timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    return proc.stdout


def ok_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(proc))


def user_error(proc: subprocess.CompletedProcess[str]) -> str:
    """A clean failure: exit 2, one message on stderr, no traceback."""
    assert proc.returncode == 2, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    assert proc.stderr.startswith("tether: error: "), proc.stderr
    return proc.stderr


@pytest.fixture
def background() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started by a test; every one still alive is killed afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=TIMEOUT)


def start_worker(
    procs: list[subprocess.Popen[bytes]], cwd: Path, env: dict[str, str], *args: str
) -> subprocess.Popen[bytes]:
    out = (cwd / f"worker-{len(procs)}.out").open("wb")
    err = (cwd / f"worker-{len(procs)}.err").open("wb")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tether", "worker", *args],
            cwd=cwd, env=env, stdout=out, stderr=err,
        )
    finally:
        out.close()
        err.close()
    procs.append(proc)
    return proc


def show(thread_id: str, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    run: dict[str, Any] = ok_json(tether("runs", "show", thread_id, "--json", cwd=cwd, env=env))
    return run


def wait_for_status(
    thread_id: str, statuses: set[str], cwd: Path, env: dict[str, str], timeout: float = TIMEOUT
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        run = show(thread_id, cwd, env)
        if run["status"] in statuses:
            return run
        assert time.monotonic() < deadline, f"run {thread_id} stuck in {run['status']}"
        time.sleep(0.2)


# -- migrate ----------------------------------------------------------------------------------


def test_migrate(empty_db_url: str, app_dir: Path) -> None:
    env = cli_env(None)
    first = ok_json(tether("migrate", "--db", empty_db_url, "--json", cwd=app_dir, env=env))
    assert first["applied"] and first["applied"] == sorted(first["applied"])
    assert first["applied"][0] == 1
    assert first["version"] == first["latest"] == first["applied"][-1]
    again = ok_json(tether("migrate", "--json", cwd=app_dir, env=cli_env(empty_db_url)))
    assert again == {"applied": [], "version": first["version"], "latest": first["latest"]}
    text = ok(tether("migrate", cwd=app_dir, env=cli_env(empty_db_url)))
    assert "up to date" in text


def test_default_db_is_tether_db_in_the_working_directory(app_dir: Path) -> None:
    env = cli_env(None)
    ok(tether("migrate", cwd=app_dir, env=env))
    assert (app_dir / "tether.db").exists()
    assert ok_json(tether("runs", "list", "--json", cwd=app_dir, env=env)) == []
    started = ok_json(tether("runs", "start", "greeter", "--app", "app:runtime", "--input",
                             '{"name": "bo"}', "--json", cwd=app_dir, env=env))
    listed = ok_json(tether("runs", "list", "--json", cwd=app_dir, env=env))
    assert [r["thread_id"] for r in listed] == [started["thread_id"]]


# -- runs, checkpoints, worker ----------------------------------------------------------------


def test_start_work_inspect_and_stop(
    db_url: str, app_dir: Path, background: list[subprocess.Popen[bytes]]
) -> None:
    env = cli_env(db_url)
    started = ok_json(tether("runs", "start", "greeter", "--app", "app:runtime",
                             "--input", '{"name": "ada"}', "--json", cwd=app_dir, env=env))
    assert started["status"] == "queued" and started["agent"] == "greeter"
    assert started["state"] == {"name": "ada"} and started["step"] == 0
    tid = started["thread_id"]
    keyed = ok_json(tether("runs", "start", "greeter", "--app", "app:make_runtime", "--input",
                           '{"name": "cy"}', "--thread-id", "cy-1", "--json",
                           cwd=app_dir, env=env))
    assert keyed["thread_id"] == "cy-1"

    worker = start_worker(background, app_dir, env, "--app", "app:runtime",
                          "--concurrency", "2", "--lease-ttl", "2")
    done = wait_for_status(tid, {"completed", "failed"}, app_dir, env)
    assert done["status"] == "completed", done["error"]
    assert done["state"] == {"name": "ada", "greeting": "hello ada", "log": ["hello", "bye"]}
    assert done["step"] == 2 and done["version"] == "v1" and done["error"] is None
    assert wait_for_status("cy-1", {"completed"}, app_dir, env)["state"]["greeting"] == "hello cy"

    listed = ok_json(tether("runs", "list", "--json", cwd=app_dir, env=env))
    by_id = {r["thread_id"]: r for r in listed}
    assert set(by_id) == {tid, "cy-1"}
    assert by_id[tid]["status"] == "completed" and "state" not in by_id[tid]
    assert ok_json(tether("runs", "list", "--status", "queued", "--json",
                          cwd=app_dir, env=env)) == []

    cps = ok_json(tether("checkpoints", tid, "--json", cwd=app_dir, env=env))
    assert [c["step"] for c in cps] == [1, 2]
    assert [c["node"] for c in cps] == ["hello", "bye"]
    assert [c["next_node"] for c in cps] == ["bye", None]
    for c in cps:
        assert c["worker"] and c["attempt"] == 1
        assert c["started_at"] <= c["finished_at"] and c["duration"] >= 0
        assert "state" not in c
    with_state = ok_json(tether("checkpoints", tid, "--state", "--json", cwd=app_dir, env=env))
    assert with_state[0]["state"] == {"name": "ada", "greeting": "hello ada", "log": ["hello"]}
    assert with_state[1]["state"] == done["state"]

    # Human-readable forms work too.
    assert tid in ok(tether("runs", "list", cwd=app_dir, env=env))
    assert "hello ada" in ok(tether("runs", "show", tid, cwd=app_dir, env=env))
    assert "bye" in ok(tether("checkpoints", tid, cwd=app_dir, env=env))

    # A run whose node is in flight when the worker gets SIGTERM is released, not lost.
    slow = ok_json(tether("runs", "start", "slow", "--app", "app:runtime", "--json",
                          cwd=app_dir, env=env))
    running = wait_for_status(slow["thread_id"], {"running"}, app_dir, env)
    assert running["lease_owner"]
    assert worker.poll() is None
    sent = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    assert time.monotonic() - sent < 8  # a 1 s grace period, then release and exit
    released = show(slow["thread_id"], app_dir, env)
    assert released["status"] == "queued"
    assert released["lease_owner"] is None
    assert released["step"] == 0
    assert show(tid, app_dir, env)["status"] == "completed"
    err = (app_dir / "worker-0.err").read_text()
    assert "Traceback" not in err, err
    # Its last line says it stopped and what it left for other workers.
    last = (app_dir / "worker-0.out").read_text().splitlines()[-1]
    assert last.startswith("tether worker: stopped by SIGTERM after "), last
    assert last.endswith("; 1 run given back (any worker resumes them now), 0 effects left "
                         "pending for another worker"), last


def test_runs_start_is_idempotent_by_key(db_url: str, app_dir: Path) -> None:
    env = cli_env(db_url)
    args = ("runs", "start", "greeter", "--app", "app:runtime", "--input", '{"name": "x"}',
            "--idempotency-key", "k-1", "--json")
    a = ok_json(tether(*args, cwd=app_dir, env=env))
    b = ok_json(tether(*args, cwd=app_dir, env=env))
    assert a["thread_id"] == b["thread_id"]
    assert len(ok_json(tether("runs", "list", "--json", cwd=app_dir, env=env))) == 1


def test_explicit_db_wins_over_tether_db(db_url: str, app_dir: Path) -> None:
    env = cli_env(f"sqlite:///{app_dir / 'not-this-one.db'}")
    started = ok_json(tether("runs", "start", "greeter", "--app", "app:runtime", "--db", db_url,
                             "--input", '{"name": "z"}', "--json", cwd=app_dir, env=env))
    shown = ok_json(tether("runs", "show", started["thread_id"], "--db", db_url, "--json",
                           cwd=app_dir, env=env))
    assert shown["state"] == {"name": "z"}
    assert not (app_dir / "not-this-one.db").exists()


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("no_such_module:runtime", "no_such_module"),
        ("app:missing", "missing"),
        ("app:not_a_runtime", "not a tether.Runtime"),
        ("app:number", "not a tether.Runtime"),
        ("app:needs_args", "needs_args"),
        ("broken:runtime", "boom at import"),
        ("badsyntax:runtime", "badsyntax"),
        ("app", "module:attr"),
    ],
)
@pytest.mark.parametrize("command", ["start", "worker"])
def test_bad_app_is_a_clear_error(
    app_dir: Path, target: str, expected: str, command: str
) -> None:
    env = cli_env(f"sqlite:///{app_dir / 'x.db'}")
    if command == "start":
        proc = tether("runs", "start", "greeter", "--app", target, cwd=app_dir, env=env)
    else:
        proc = tether("worker", "--app", target, cwd=app_dir, env=env, timeout=20)
    message = user_error(proc)
    assert expected in message


def test_worker_needs_an_app(app_dir: Path) -> None:
    message = user_error(tether("worker", cwd=app_dir, env=cli_env(f"sqlite:///{app_dir}/x.db")))
    assert "--app" in message


@pytest.mark.parametrize("url", ["nonsense", "mysql://u@h/db", "sqlite://host/x.db"])
def test_malformed_db_is_a_clear_error(app_dir: Path, url: str) -> None:
    message = user_error(tether("runs", "list", "--db", url, cwd=app_dir, env=cli_env(None)))
    assert "malformed" in message or "unsupported" in message
    assert "sqlite:///" in message  # says what a valid URL looks like
    user_error(tether("migrate", cwd=app_dir, env=cli_env(url)))


def test_unreachable_db_is_a_clear_error_without_the_password(app_dir: Path) -> None:
    url = "postgresql://u:secret@127.0.0.1:1/db"
    for proc in (
        tether("runs", "list", "--db", url, cwd=app_dir, env=cli_env(None)),
        tether("migrate", cwd=app_dir, env=cli_env(url)),
        tether("runs", "start", "greeter", "--app", "app:runtime", cwd=app_dir, env=cli_env(url)),
    ):
        message = user_error(proc)
        assert "secret" not in proc.stderr + proc.stdout
        assert "127.0.0.1" in message


def test_unmigrated_db_says_to_run_migrate(empty_db_url: str, app_dir: Path) -> None:
    env = cli_env(empty_db_url)
    for proc in (
        tether("runs", "list", cwd=app_dir, env=env),
        tether("runs", "start", "greeter", "--app", "app:runtime", "--input", '{"name": "q"}',
               cwd=app_dir, env=env),
        tether("worker", "--app", "app:runtime", cwd=app_dir, env=env, timeout=20),
    ):
        assert "tether migrate" in user_error(proc)


def test_unknown_run_and_agent(db_url: str, app_dir: Path) -> None:
    env = cli_env(db_url)
    assert "no-such-run" in user_error(tether("runs", "show", "no-such-run", cwd=app_dir, env=env))
    assert "no-such-run" in user_error(tether("checkpoints", "no-such-run", cwd=app_dir, env=env))
    assert "no run with thread_id 'no-such-run'" in user_error(
        tether("effects", "list", "--thread", "no-such-run", cwd=app_dir, env=env))
    message = user_error(tether("runs", "start", "ghost", "--app", "app:runtime",
                                cwd=app_dir, env=env))
    assert "ghost" in message and "greeter" in message


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", '"text"'])
def test_bad_input_json(db_url: str, app_dir: Path, raw: str) -> None:
    env = cli_env(db_url)
    user_error(tether("runs", "start", "greeter", "--app", "app:runtime", "--input", raw,
                      cwd=app_dir, env=env))
    assert ok_json(tether("runs", "list", "--json", cwd=app_dir, env=env)) == []


# -- the operator's verbs and the errors that guide --------------------------------------------


def timed_out(proc: subprocess.CompletedProcess[str]) -> str:
    """A wait that ran out of time: exit 4, one line that says what to look at, no traceback."""
    assert proc.returncode == 4, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr


def test_wait_retry_send_and_release(
    db_url: str, app_dir: Path, background: list[subprocess.Popen[bytes]]
) -> None:
    env = cli_env(db_url, COLUMNS="80")
    app = ("--app", "app:runtime")
    # No worker yet: --wait runs out of time with a hint, not a TimeoutError traceback.
    err = timed_out(tether("runs", "start", "flaky", *app, "--thread-id", "flaky-run-with-a-long-id-0001",
                           "--wait", "0.5", cwd=app_dir, env=env))
    assert "flaky-run-with-a-long-id-0001 is still queued after 0.5s" in err
    assert "is a worker running" in err
    assert "still queued" in timed_out(tether("runs", "wait", "flaky-run-with-a-long-id-0001",
                                              "--until", "waiting", "--timeout", "0.3",
                                              cwd=app_dir, env=env))
    # Ids are never cut, even at 80 columns.
    assert "flaky-run-with-a-long-id-0001" in ok(tether("runs", "list", cwd=app_dir, env=env))
    bogus = tether("runs", "list", "--status", "bogus", cwd=app_dir, env=env)
    assert bogus.returncode == 2 and "'bogus' is not one of" in bogus.stderr, bogus.stderr

    sent = ok_json(tether("runs", "send", "flaky-run-with-a-long-id-0001", "--message",
                          '{"hi": 1}', "--sender", "ops", "--json", cwd=app_dir, env=env))
    assert sent["message"] == {"hi": 1} and sent["sender"] == "ops"
    assert show("flaky-run-with-a-long-id-0001", app_dir, env)["inbox_depth"] == 1
    assert "not valid JSON" in user_error(tether("runs", "send", "flaky-run-with-a-long-id-0001",
                                                 "--message", "{", cwd=app_dir, env=env))

    start_worker(background, app_dir, env, *app, "--lease-ttl", "2")
    waited = tether("runs", "wait", "flaky-run-with-a-long-id-0001", "--json", cwd=app_dir, env=env)
    assert waited.returncode == 1, (waited.stdout, waited.stderr)  # 1: the run failed
    failed = json.loads(waited.stdout)
    assert failed["status"] == "failed" and "not fixed yet" in failed["error"]["message"]
    assert failed["failed_node"] is not None
    assert "(failed)" in ok(tether("runs", "list", cwd=app_dir, env=env))
    assert "failed_node=" in ok(tether("runs", "show", "flaky-run-with-a-long-id-0001",
                                       cwd=app_dir, env=env))
    assert "can never read mail" in user_error(tether(
        "runs", "send", "flaky-run-with-a-long-id-0001", "--message", "1", cwd=app_dir, env=env))

    (app_dir / "fixed").write_text("")
    out = ok(tether("runs", "retry", "flaky-run-with-a-long-id-0001", *app, cwd=app_dir, env=env))
    assert out.startswith("flaky-run-with-a-long-id-0001 ")
    done = ok_json(tether("runs", "wait", "flaky-run-with-a-long-id-0001", "--timeout", "30",
                          "--json", cwd=app_dir, env=env))
    assert (done["status"], done["state"]) == ("completed", {"fixed": True})
    assert "only a failed run can be retried" in user_error(tether(
        "runs", "retry", "flaky-run-with-a-long-id-0001", *app, cwd=app_dir, env=env))
    assert "pass --app module:attr" in user_error(tether("runs", "retry", "x", cwd=app_dir, env=env))

    released = ok_json(tether("workers", "release", "nobody:1:x", "--json", cwd=app_dir, env=env))
    assert released == {"worker": "nobody:1:x", "released": []}


def test_settings_come_from_one_place(
    app_dir: Path, background: list[subprocess.Popen[bytes]]
) -> None:
    """[tool.tether] names the app and database once; reads never create a database file, and
    their error names the database and where its URL came from; `tether worker` prints every
    setting with its source, TETHER_CONCURRENCY included."""
    pyproject = app_dir / "pyproject.toml"
    pyproject.write_text('[tool.tether]\napp = "app:runtime"\ndb = "sqlite:///proj.db"\n')
    env = cli_env(None)
    for read in (("runs", "list"), ("interrupts",), ("checkpoints", "x"), ("effects", "list")):
        message = user_error(tether(*read, cwd=app_dir, env=env))
        assert f"no file {app_dir / 'proj.db'}" in message, message
        assert f"came from [tool.tether] in {pyproject}" in message, message
        assert "tether migrate" in message
    assert not (app_dir / "proj.db").exists() and not (app_dir / "tether.db").exists()
    # The environment wins over the file, and the error says so.
    assert "came from TETHER_DB" in user_error(tether(
        "runs", "list", cwd=app_dir, env=cli_env("sqlite:///other.db")))

    ok(tether("migrate", cwd=app_dir, env=env))
    assert (app_dir / "proj.db").exists()
    started = ok_json(tether("runs", "start", "greeter", "--input", '{"name": "cfg"}', "--json",
                             cwd=app_dir, env=env))  # no --app: [tool.tether] names it
    worker = start_worker(background, app_dir, {**env, "TETHER_CONCURRENCY": "3"})
    done = wait_for_status(started["thread_id"], {"completed"}, app_dir, env)
    assert done["state"]["greeting"] == "hello cfg"
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    printed = (app_dir / "worker-0.out").read_text()
    lines = {line.split()[0]: line for line in printed.splitlines()[1:] if line.startswith("  ")}
    assert "app:runtime" in lines["app"] and f"([tool.tether] in {pyproject})" in lines["app"]
    assert str(app_dir / "proj.db") in lines["db"] and "[tool.tether]" in lines["db"]
    assert " 3 " in lines["concurrency"] and "(TETHER_CONCURRENCY)" in lines["concurrency"]
    assert "(default)" in lines["lease_ttl"]
    assert "(TETHER_SHUTDOWN_GRACE)" in lines["shutdown_grace"]


def test_version(app_dir: Path) -> None:
    import tether as package

    assert ok(tether("--version", cwd=app_dir, env=cli_env(None))) == f"tether {package.__version__}\n"


def test_runs_wait_on_a_run_waiting_for_a_person_says_so(
        db_url: str, app_dir: Path, background: list[subprocess.Popen[bytes]]) -> None:
    env = cli_env(db_url)
    ok(tether("runs", "start", "asker", "--app", "app:runtime", "--thread-id", "ask-1",
              cwd=app_dir, env=env))
    start_worker(background, app_dir, env, "--app", "app:runtime")
    wait_for_status("ask-1", {"waiting"}, app_dir, env)
    said = timed_out(tether("runs", "wait", "ask-1", "--timeout", "0.3", cwd=app_dir, env=env))
    assert "it waits for a person to answer its interrupt" in said, said
    assert "tether runs resume ask-1 --value JSON" in said and "/ui/interrupts" in said, said
    assert "is a worker running" not in said, said
    ok(tether("runs", "resume", "ask-1", "--value", '"yes"', "--app", "app:runtime",
              cwd=app_dir, env=env))
    done = tether("runs", "wait", "ask-1", "--timeout", "30", "--json", cwd=app_dir, env=env)
    assert done.returncode == 0 and json.loads(done.stdout)["state"]["answer"] == "yes", done


def test_runs_wait_exit_status_says_how_the_run_ended(db_url: str, app_dir: Path) -> None:
    """0 completed, 1 failed (see the flaky run above), 3 cancelled, 4 timed out."""
    env = cli_env(db_url)
    app = ("--app", "app:runtime")
    ok(tether("runs", "start", "slow", *app, "--thread-id", "slow-1", cwd=app_dir, env=env))
    timed_out(tether("runs", "wait", "slow-1", "--timeout", "0.2", cwd=app_dir, env=env))
    ok(tether("runs", "cancel", "slow-1", *app, cwd=app_dir, env=env))
    cancelled = tether("runs", "wait", "slow-1", "--timeout", "5", cwd=app_dir, env=env)
    assert cancelled.returncode == 3, (cancelled.stdout, cancelled.stderr)
    assert cancelled.stdout == "slow-1 cancelled\n"
