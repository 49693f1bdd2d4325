"""The engine-process helper on stand-in processes: no vLLM needed, runs in seconds."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.engine.launch import server

# A stand-in engine: answers /health with 200 on $ENGINE_PORT and forks a child into its process
# group, as vLLM forks its engine core.
HEALTHY_ENGINE = """
import http.server, os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
print("child", child.pid, flush=True)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["ENGINE_PORT"])), Health).serve_forever()
"""


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_an_engine_that_exits_during_start_up_returns_its_code_and_log(tmp_path: Path) -> None:
    argv = python("import sys; print('NotImplementedError: no fp8 here'); sys.exit(3)")

    outcome = server.start_server(argv, server.free_port(), tmp_path / "engine.log")

    assert outcome == server.StartupFailure(exit_code=3, log="NotImplementedError: no fp8 here\n")


def test_an_engine_that_never_answers_is_stopped_at_the_deadline(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    argv = python("import os, signal; print(os.getpid(), flush=True); signal.pause()")

    with pytest.raises(TimeoutError):
        server.start_server(argv, server.free_port(), log, startup_deadline_s=1.0)

    assert not pid_alive(int(log.read_text()))


def test_a_healthy_engine_is_returned_and_stop_ends_its_whole_group(tmp_path: Path) -> None:
    port = server.free_port()
    log = tmp_path / "engine.log"

    started = server.start_server(python(HEALTHY_ENGINE), port, log, env={"ENGINE_PORT": str(port)})

    assert isinstance(started, server.RunningServer)
    child = int(log.read_text().split()[1])
    assert pid_alive(child)
    assert started.stop() == -signal.SIGTERM
    assert not pid_alive(child)
    assert not server.is_healthy(port)
