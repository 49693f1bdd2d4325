"""Detached child processes that outlive the command that started them, and their end.

A process is identified by pid AND its start time (from /proc), so a recycled pid is never
signalled by mistake.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Running:
    name: str
    pid: int
    start_ticks: int
    log: str


def start_process(
    name: str, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None
) -> Running:
    """Start `argv` in its own session, output appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
        )
    return Running(name, proc.pid, _start_ticks(proc.pid) or 0, str(log))


def is_alive(proc: Running) -> bool:
    ticks = _start_ticks(proc.pid)
    return ticks is not None and ticks == proc.start_ticks


def stop_process(proc: Running, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL once `timeout` passes; returns when the process is gone."""
    if not is_alive(proc):
        _reap(proc.pid)
        return
    os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while is_alive(proc):
        _reap(proc.pid)
        if time.monotonic() >= deadline:
            os.kill(proc.pid, signal.SIGKILL)
            deadline = time.monotonic() + timeout
        time.sleep(0.05)


def _reap(pid: int) -> None:
    # Our own children become zombies until waited for; someone else's are not ours to wait.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _start_ticks(pid: int) -> int | None:
    """Start time of a live (non-zombie) process, or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # Fields after the parenthesised command: state is the 1st, starttime the 20th.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in {"Z", "X"}:
        return None
    return int(fields[19])
