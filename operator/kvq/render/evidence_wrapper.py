#!/usr/bin/env python3
"""Run the engine; when it fails, write its root-cause lines to the termination log.

Usage: python3 evidence_wrapper.py -- ENGINE_COMMAND...

Why: with `terminationMessagePolicy: FallbackToLogsOnError` the kubelet keeps only the
last 2,048 bytes / 80 lines of the log, and a vLLM start-up crash buries its root cause
(the worker's `NotImplementedError: ...`) above kilobytes of multiprocessing
tracebacks. This wrapper passes the engine's output through unchanged, remembers the
lines that name an error, and on a non-zero exit writes a short summary (at most 4 KiB:
the exit code and the deduplicated root-cause lines, most specific first) to the
termination log, which the operator reads from the pod status. Under each specific cause
it writes the innermost frames of the engine's packages that raised it (`File "vllm/...",
line N, in f`): where an error was raised (building the model class, its config, the
attention backend) tells the operator what it is when the words do not.

Stdlib only: it runs under the engine image's own python3. Environment:
  KVQ_TERMINATION_LOG   where to write the summary (default /dev/termination-log)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import BinaryIO

MAX_SUMMARY_BYTES = 4096
MAX_LINE_CHARS = 600
MAX_CAUSES = 64
TAIL_LINES = 12
FOLLOW_LINES = 30
MAX_CONTEXT = 3
# Frames kept per cause: the innermost ones of the engine's own packages.
MAX_FRAMES = 6
_MAX_PENDING = 1 << 16
PUMP_GRACE_SECONDS = 10.0

# `(Worker pid=17683) ERROR 11-30 09:49:16 [multiproc_executor.py:1063] ` and friends.
_PROCESS_PREFIX = re.compile(r"^\((?:[\w.\-]+)(?: pid=\d+)?\) ?")
_LOG_PREFIX = re.compile(
    r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?"
)
# The last line of a Python traceback: `pkg.mod.SomeError: message`.
_EXCEPTION = re.compile(
    r"^(?P<type>(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Unsupported|Exit))"
    r"(?::\s*(?P<message>.*))?$"
)
_OTHER_CAUSES = re.compile(
    r"(CUDA out of memory|CUDA error: |Data-dependent assertion failed|NCCL error|"
    r"Killed$|Segmentation fault|core dumped)"
)
# uvicorn's line once the server listens: a failure after it is not a start-up failure.
SERVING_MARKER = "Application startup complete"
_CONTEXT = re.compile(r"^\s*(Explanation: .*|assert .*)$")
_PROCESS_TAG = re.compile(r"^(\([\w.\-]+(?: pid=\d+)?\))")
_TRACEBACK = re.compile(r"^\s*Traceback \(most recent call last\):")
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
# The engine's packages (installed: named from the package directory on).
_ENGINE_FRAME = re.compile(r"(?:^|/)(?:site|dist)-packages/(?P<module>(?:vllm|transformers)/.*)$")
# Lines that only point elsewhere ("see root cause above"): shown after specific ones.
_GENERIC = re.compile(
    r"(root cause|see stack trace|See stack trace|initialization failed|EngineDeadError|"
    r"Worker failed with error|EngineCore failed|APIServer failed|"
    r"died unexpectedly|Engine process failed)",
    re.IGNORECASE,
)


@dataclass
class Cause:
    line: str
    order: int
    generic: bool
    context: list[str] = field(default_factory=list)
    frames: list[str] = field(default_factory=list)


@dataclass
class Evidence:
    """Root-cause lines seen so far, plus the last lines for when none are found."""

    causes: dict[str, Cause] = field(default_factory=dict)
    tail: list[str] = field(default_factory=list)
    served_before_failure: bool = False
    _following: Cause | None = None
    _follow_left: int = 0
    _seen: int = 0
    # The engine frames of the traceback each process is printing, innermost last.
    _frames: dict[str, list[str]] = field(default_factory=dict)

    def add_line(self, raw: str) -> None:
        tag = _PROCESS_TAG.match(raw)
        process = tag.group(1) if tag else ""
        line = strip_prefixes(raw.rstrip("\r\n"))
        if not line.strip():
            return
        if _TRACEBACK.match(line):
            self._frames[process] = []
        frame = _FRAME.match(line)
        if frame is not None:
            engine = _ENGINE_FRAME.search(frame.group("path"))
            if engine is not None:
                frames = self._frames.setdefault(process, [])
                frames.append(
                    f'File "{engine.group("module")}", line {frame.group("line")}, '
                    f"in {frame.group('function')}"
                )
                del frames[:-MAX_FRAMES]
        self.tail.append(line[:MAX_LINE_CHARS])
        del self.tail[:-TAIL_LINES]
        if self._following is not None and self._follow_left > 0:
            self._follow_left -= 1
            context = _CONTEXT.match(line)
            if context and len(self._following.context) < MAX_CONTEXT:
                text = context.group(1).strip()[:MAX_LINE_CHARS]
                if text not in self._following.context:
                    self._following.context.append(text)
        stripped = line.strip()
        if SERVING_MARKER in stripped and not self.causes:
            self.served_before_failure = True
        if _EXCEPTION.match(stripped) or _OTHER_CAUSES.search(stripped):
            self._remember(stripped[:MAX_LINE_CHARS], self._frames.pop(process, []))

    def _remember(self, line: str, frames: list[str]) -> None:
        self._seen += 1
        known = self.causes.get(line)
        if known is None:
            if len(self.causes) >= MAX_CAUSES:
                return
            known = Cause(line=line, order=self._seen, generic=bool(_GENERIC.search(line)))
            self.causes[line] = known
        if not known.generic and len(frames) > len(known.frames):
            known.frames = frames
        self._following = known
        self._follow_left = FOLLOW_LINES

    def ranked(self) -> list[Cause]:
        """Specific causes first (in order of appearance), then the generic ones."""
        return sorted(self.causes.values(), key=lambda c: (c.generic, c.order))


def strip_prefixes(line: str) -> str:
    line = _PROCESS_PREFIX.sub("", line, count=1)
    return _LOG_PREFIX.sub("", line, count=1)


def summarize(exit_code: int, evidence: Evidence, note: str = "") -> str:
    """The termination message: exit code, then root causes, within MAX_SUMMARY_BYTES."""
    lines = [f"engine exited with code {exit_code}{note}"]
    if evidence.served_before_failure:
        lines.append(f"the engine had started serving ({SERVING_MARKER}) before it failed")
    causes = evidence.ranked()
    if causes:
        lines.append("error lines, most specific first:")
        for cause in causes:
            lines.append(cause.line)
            lines.extend(f"  {c}" for c in cause.context)
            lines.extend(f"  {f}" for f in cause.frames)
    else:
        lines.extend(["no error line found; last lines:", *evidence.tail])
    return _fit(lines, MAX_SUMMARY_BYTES)


def _fit(lines: list[str], limit: int) -> str:
    out: list[str] = []
    size = 0
    for line in lines:
        encoded = len(line.encode("utf-8")) + 1
        if size + encoded > limit:
            room = limit - size - 1
            if room > 16:
                out.append(line.encode("utf-8")[:room].decode("utf-8", "ignore"))
            break
        out.append(line)
        size += encoded
    return "\n".join(out)


def _pump(source: BinaryIO, sink: BinaryIO, evidence: Evidence, lock: threading.Lock) -> None:
    """Copy the child's stream through unchanged, feeding complete lines to the scanner."""
    pending = b""
    fd = source.fileno()
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        sink.write(chunk)
        sink.flush()
        pending += chunk
        *complete, pending = pending.split(b"\n")
        pending = pending[-_MAX_PENDING:]
        with lock:
            for raw in complete:
                evidence.add_line(raw.decode("utf-8", "replace"))
    if pending:
        with lock:
            evidence.add_line(pending.decode("utf-8", "replace"))


def run(command: list[str], termination_log: str) -> int:
    forwarded: list[int] = []
    children: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        for child in children:
            child.send_signal(signum)

    # Handlers first, so a stop request that races the start still reaches the engine.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, forward)
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    children.append(child)
    if forwarded:
        child.send_signal(forwarded[0])

    evidence = Evidence()
    lock = threading.Lock()
    assert child.stdout is not None and child.stderr is not None
    pumps = [
        threading.Thread(
            target=_pump, args=(child.stdout, sys.stdout.buffer, evidence, lock), daemon=True
        ),
        threading.Thread(
            target=_pump, args=(child.stderr, sys.stderr.buffer, evidence, lock), daemon=True
        ),
    ]
    for pump in pumps:
        pump.start()
    returncode = child.wait()
    for pump in pumps:
        # Orphaned grandchildren may hold the pipe open; do not wait for them forever.
        pump.join(timeout=PUMP_GRACE_SECONDS)

    exit_code = returncode if returncode >= 0 else 128 - returncode
    # vLLM exits 0 after its engine dies once it is serving (a crash at the first request):
    # error lines with no stop request from us are a failure whatever the exit code says.
    failed_quietly = exit_code == 0 and bool(evidence.causes) and not forwarded
    if exit_code != 0 or failed_quietly:
        note = ""
        if returncode < 0:
            note += f" (killed by signal {-returncode})"
        if forwarded:
            note += f" after signal {forwarded[0]} was forwarded to it"
        _write(termination_log, summarize(exit_code, evidence, note))
    return exit_code


def _write(path: str, message: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as out:
            out.write(message)
    except OSError as error:
        print(f"kvq evidence wrapper: cannot write {path}: {error}", file=sys.stderr)


def main(argv: list[str]) -> int:
    if "--" in argv:
        argv = argv[argv.index("--") + 1 :]
    if not argv:
        print("usage: evidence_wrapper.py -- ENGINE_COMMAND...", file=sys.stderr)
        return 2
    return run(argv, os.environ.get("KVQ_TERMINATION_LOG", "/dev/termination-log"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
