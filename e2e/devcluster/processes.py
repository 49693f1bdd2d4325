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

# Popen handles of the processes this interpreter started: kept so that stopping one reaps
# it (no zombie, no ResourceWarning); a process started by another command has none.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class Running:
    name: str
    pid: int
    start_ticks: int
    log: str
    argv: tuple[str, ...] = ()
    """How it was started (what a restart runs again)."""


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
    _CHILDREN[proc.pid] = proc
    return Running(name, proc.pid, _start_ticks(proc.pid) or 0, str(log), tuple(argv))


def is_alive(proc: Running) -> bool:
    ticks = _start_ticks(proc.pid)
    return ticks is not None and ticks == proc.start_ticks


def stop_process(proc: Running, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL once `timeout` passes; returns when the process is gone."""
    if is_alive(proc):
        os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while is_alive(proc):
            if time.monotonic() >= deadline:
                os.kill(proc.pid, signal.SIGKILL)
                deadline = time.monotonic() + timeout
            time.sleep(0.05)
    child = _CHILDREN.pop(proc.pid, None)
    if child is not None:
        child.wait(timeout)
    else:
        _reap(proc.pid)


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
    if fields[0] in {"Z", "X"} and _thread_count(pid) <= 1:
        # A zombie leader whose other threads still run (a Go program exiting) is not gone.
        return None
    return int(fields[19])


def _thread_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return 0
