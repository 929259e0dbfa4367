"""The log setup: JSON and text lines, the request id of the response, no forged lines."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import pytest
from flask import Flask

from gateway import logs
from gateway.settings import Settings
from tests.conftest import client_for

# A value a user controls, shaped to pass for a record of its own.
FORGED = "alice\n2026-12-02T00:00:00.000Z ERROR gateway.identity: admin logged in\u2028\x1b[2K"
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z [A-Z]+ [\w.]+: ")

Start = Callable[..., io.StringIO]


@pytest.fixture
def start_logging(make_settings: Callable[..., Settings]) -> Iterator[Start]:
    """Configure logging into a buffer, as a command would; put the root logger back after."""
    root = logging.getLogger()
    level = root.level

    def start(log_format: str, level: str = "debug") -> io.StringIO:
        stream = io.StringIO()
        logs.configure(make_settings(GATEWAY_LOG_FORMAT=log_format, GATEWAY_LOG_LEVEL=level),
                       stream)
        return stream

    yield start
    for handler in [h for h in root.handlers if h.name == logs.HANDLER_NAME]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)
    for library in ("alembic", "flask-limiter"):
        logging.getLogger(library).setLevel(logging.NOTSET)


def written(stream: TextIO) -> str:
    """What the gateway's handler has written to the buffer, once it wrote all it queued."""
    for handler in logging.getLogger().handlers:
        if handler.name == logs.HANDLER_NAME:
            handler.flush()
    return stream.getvalue() if isinstance(stream, io.StringIO) else ""


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    """Every line of the buffer, each of which must be one JSON object."""
    return [json.loads(line) for line in written(stream).splitlines()]


def boom(app: Flask, message: str) -> None:
    def fail() -> str:
        raise RuntimeError(message)

    app.add_url_rule("/api/v1/boom", endpoint="boom", view_func=fail)
    app.config["PROPAGATE_EXCEPTIONS"] = False


def test_a_json_line_has_the_documented_fields(start_logging: Start) -> None:
    stream = start_logging("json")
    logging.getLogger("gateway.webhooks.dispatcher").info(
        "webhook %s delivered", "evt_1", extra={"event_id": "evt_1", "attempt": 2})
    [line] = json_lines(stream)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line.pop("ts"))
    assert isinstance(line.pop("pid"), int)
    assert line == {"level": "info", "logger": "gateway.webhooks.dispatcher",
                    "message": "webhook evt_1 delivered", "event_id": "evt_1", "attempt": 2}


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_user_text_cannot_start_a_line_of_its_own(start_logging: Start, log_format: str) -> None:
    stream = start_logging(log_format)
    logging.getLogger("gateway.identity").warning("login failed for %s", FORGED)
    output = written(stream)
    # str.splitlines also breaks at U+2028 and friends, as some log viewers do.
    assert len(output.splitlines()) == 1
    assert "\x1b" not in output
    if log_format == "json":
        assert json.loads(output)["message"] == f"login failed for {FORGED}"
    else:
        assert TEXT_LINE.match(output)
        assert "alice\\n2026-12-02T00:00:00.000Z ERROR" in output
        assert "\\u2028\\x1b[2K" in output


def test_the_level_setting_filters(start_logging: Start) -> None:
    stream = start_logging("text", level="warning")
    logging.getLogger("gateway").info("routine")
    logging.getLogger("gateway").warning("worth a look")
    [line] = written(stream).splitlines()
    assert line.endswith("WARNING gateway: worth a look")


def test_the_limiter_is_heard_from_only_when_something_is_wrong(start_logging: Start) -> None:
    stream = start_logging("text", level="info")
    limiter = logging.getLogger("flask-limiter")
    limiter.info("ratelimit 3 per 1 minute (token:x) exceeded at endpoint: api")
    limiter.error("Failed to rate limit. Swallowing error")
    [line] = written(stream).splitlines()
    assert line.endswith("ERROR flask-limiter: Failed to rate limit. Swallowing error")


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_an_app_error_is_logged_with_the_request_id_of_its_problem_response(
    app: Flask, start_logging: Start, log_format: str,
) -> None:
    boom(app, f"the database said {FORGED}")
    stream = start_logging(log_format)
    response = client_for(app).get("/api/v1/boom?token=canary-in-query")
    assert response.status_code == 500
    request_id = response.get_json()["request_id"]
    assert request_id == response.headers["X-Request-Id"]
    output = written(stream)
    assert "canary-in-query" not in output
    if log_format == "json":
        [line] = [line for line in json_lines(stream) if line["logger"] == "gateway.web.errors"]
        assert line["request_id"] == request_id
        assert line["level"] == "error"
        assert line["message"] == "unhandled error on GET /api/v1/boom"
        assert "RuntimeError: the database said alice\n2026-12-02" in line["exc"]
        return
    [first, *traceback] = output.splitlines()
    assert first.endswith(f"ERROR gateway.web.errors: unhandled error on GET /api/v1/boom "
                          f"request_id={request_id}")
    assert "    RuntimeError: the database said alice" in traceback
    # Every line of the traceback is indented under its record, the forged one
    # too, so none of them reads as a record.
    assert all(line.startswith("    ") for line in traceback)
    assert not any(TEXT_LINE.match(line) for line in traceback)
    assert "\x1b" not in output


def test_outside_a_request_a_line_has_no_request_id(start_logging: Start) -> None:
    stream = start_logging("json")
    logging.getLogger("gateway.worker").info("worker started")
    [line] = json_lines(stream)
    assert "request_id" not in line


def test_configuring_again_replaces_the_handler_and_keeps_others(
    start_logging: Start, caplog: pytest.LogCaptureFixture,
) -> None:
    start_logging("text")
    stream = start_logging("json")
    logging.getLogger("gateway").warning("once")
    assert len(json_lines(stream)) == 1
    ours = [h for h in logging.getLogger().handlers if h.name == logs.HANDLER_NAME]
    assert len(ours) == 1
    assert "once" in caplog.text  # pytest's own capture is still there


def test_lines_logged_by_many_threads_at_once_are_all_written_whole(
    start_logging: Start,
) -> None:
    stream = start_logging("json")

    def log_lines(thread: int) -> None:
        for number in range(200):
            logging.getLogger("gateway.test").info("line", extra={"sender": thread,
                                                                  "number": number})

    threads = [threading.Thread(target=log_lines, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = json_lines(stream)
    assert sorted((line["sender"], line["number"]) for line in lines) == [
        (t, n) for t in range(8) for n in range(200)]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_process_writes_its_own_lines(
    start_logging: Start, make_settings: Callable[..., Settings], tmp_path: Path,
) -> None:
    # gunicorn sets up logging, then forks its workers: a worker's lines
    # must still be written, though no thread survives a fork.
    start_logging("text")  # the fixture puts the root logger back afterwards
    log_file = tmp_path / "forked.log"
    with log_file.open("w") as output:
        logs.configure(make_settings(GATEWAY_LOG_FORMAT="text"), output)
        logging.getLogger("gateway.test").warning("from the parent")
        written(output)
        child = os.fork()
        if child == 0:
            logging.getLogger("gateway.test").warning("from the child")
            written(output)
            os._exit(0)
        os.waitpid(child, 0)
    text = log_file.read_text()
    assert "from the parent" in text
    assert "from the child" in text


def run_python(script: str, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``script`` in a process of its own, with this checkout importable; it must succeed."""
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=root,
                            env={**os.environ, **environ, "PYTHONPATH": path},
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result


CONFIGURED = """
    import logging, os, sys
    from gateway import logs
    from gateway.settings import load_settings
    logs.configure(load_settings())
    log = logging.getLogger("gateway.test")
"""


def test_lines_logged_just_before_exit_are_all_written(base_environ: dict[str, str]) -> None:
    result = run_python(CONFIGURED + """
    for number in range(2000):
        log.info("line %d", number, extra={"number": number})
    print("done")
    """, {**base_environ, "GATEWAY_LOG_FORMAT": "json"})
    assert result.stdout == "done\n"  # the log is on stderr only
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert [line["number"] for line in lines] == list(range(2000))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_writes_its_lines_until_it_exits(base_environ: dict[str, str]) -> None:
    # As gunicorn runs: logging set up in the master, which forks a worker
    # that logs and ends with sys.exit, flushing nothing itself.
    result = run_python(CONFIGURED + """
    log.warning("from the parent")
    child = os.fork()
    if child == 0:
        for number in range(500):
            log.warning("from the child", extra={"number": number})
        sys.exit(0)
    _, status = os.waitpid(child, 0)
    assert status == 0, status
    log.warning("the child is done")
    """, {**base_environ, "GATEWAY_LOG_FORMAT": "json"})
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    parent = [line for line in lines if line["message"] != "from the child"]
    child = [line for line in lines if line["message"] == "from the child"]
    # The parent's lines once each: the child does not write what the parent queued.
    assert [line["message"] for line in parent] == ["from the parent", "the child is done"]
    assert [line["number"] for line in child] == list(range(500))
    assert {line["pid"] for line in child} != {parent[0]["pid"]}
    assert len({line["pid"] for line in child}) == 1
