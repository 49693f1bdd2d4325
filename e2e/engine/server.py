"""Starts a real vLLM OpenAI server process, probes it on 127.0.0.1, stops it.

The caller hands over the whole argv (the engine tests pass the container command kvq
renders, wrapper included); this module only owns the process: its own process group,
its log file, waiting for `/health` with a deadline, and a clean stop of the group
(vLLM forks an engine-core and a worker process that must not outlive the test).

Standard library only, so it runs in the project venv as well as the engine venv.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class StartupFailure:
    """The server process exited before `/health` answered."""

    exit_code: int
    log: str


@dataclass
class RunningServer:
    """A healthy server; `stop()` ends its whole process group."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def get_text(self, path: str, timeout_s: float = 30.0) -> str:
        with urllib.request.urlopen(self.base_url + path, timeout=timeout_s) as response:
            return str(response.read().decode())

    def post_json(
        self, path: str, body: Mapping[str, object], timeout_s: float = 120.0
    ) -> dict[str, object]:
        request = urllib.request.Request(
            self.base_url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer: dict[str, object] = json.loads(response.read())
            return answer

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_exit(self, timeout_s: float) -> int | None:
        """The exit code if the server ends within `timeout_s`, else None."""
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace_s: float = 30.0) -> int:
        """SIGTERM to the group, SIGKILL after `grace_s`; returns the exit code."""
        return stop_process_group(self.process, grace_s)


def is_healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=5) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def start_server(
    argv: Sequence[str],
    port: int,
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    startup_deadline_s: float = 300.0,
    poll_s: float = 0.5,
) -> RunningServer | StartupFailure:
    """Runs `argv` (which must make the server listen on `port`) until `/health` is OK.

    `env` is laid over this process's environment. Returns a StartupFailure if the
    process exits first; raises TimeoutError (after stopping it) at the deadline: the
    log file says why.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # own process group: stop() reaches the workers
        )
    try:
        exit_code = wait_healthy_or_exit(process, port, startup_deadline_s, poll_s)
    except BaseException:  # the deadline, or Ctrl-C / pytest-timeout: leave nothing behind
        stop_process_group(process, grace_s=10.0)
        raise
    if exit_code is None:
        return RunningServer(process=process, port=port, log_path=log_path)
    stop_process_group(process, grace_s=10.0)  # orphaned workers, if any
    return StartupFailure(exit_code=exit_code, log=log_path.read_text(errors="replace"))


def wait_healthy_or_exit(
    process: subprocess.Popen[bytes], port: int, deadline_s: float, poll_s: float
) -> int | None:
    """None once `/health` answers OK, the exit code if the process ends first."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if is_healthy(port):
            return None
        try:
            return process.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            continue
    raise TimeoutError(f"vLLM not healthy on port {port} within {deadline_s:.0f} s")


def stop_process_group(process: subprocess.Popen[bytes], grace_s: float) -> int:
    """Ends the process and every process of its group; returns the leader's exit code."""
    group = process.pid  # start_new_session made the leader's pid the group id
    signal_group(group, signal.SIGTERM)
    try:
        exit_code = process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        signal_group(group, signal.SIGKILL)
        exit_code = process.wait()
    wait_group_gone(group, grace_s)
    return exit_code


def signal_group(group: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, sig)


def wait_group_gone(group: int, grace_s: float) -> None:
    """Waits until the group is empty, SIGKILLing stragglers after `grace_s`.

    Bounded: an unreaped zombie still counts as a member, so this never waits forever.
    """
    if not wait_until(lambda: not group_alive(group), grace_s):
        signal_group(group, signal.SIGKILL)
        wait_until(lambda: not group_alive(group), grace_s)


def wait_until(condition: Callable[[], bool], timeout_s: float, poll_s: float = 0.1) -> bool:
    """Polls `condition` until it holds (True) or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
