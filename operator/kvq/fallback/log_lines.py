"""Reading an engine log: which lines state an error, the root cause, a stable signature.

vLLM prefixes its lines ("(Worker pid=17683) ERROR 11-30 09:49:16 [file.py:1063] "),
re-raises errors with pointers to the cause printed earlier ("see root cause above"), and
logs warnings that name exceptions without failing; the classifier matches known messages
on what is left.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvq.api.credentials import redact_text
from kvq.fallback.evidence import bound_excerpt

# "(Worker pid=17683) ERROR 11-30 09:49:16 [multiproc_executor.py:1063] " and friends.
# Also docker compose's "vllm-1  | " and older vLLM's "ERROR 11-18 18:07:28 engine.py:366] ".
_LOG_PREFIX = re.compile(
    r"^(?:[\w.-]+\s+\|\s)?(?:\([\w .=-]+ pid=\d+\)\s*)?"
    r"(?:\[?(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)"
    r"(?::|\|\S+|\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[?[^\]]*\]|\s+\[[^\]]*\])"
    r"(?:\s+\S+\s+\S+\s+>>)?\s*)?"
)
_QUIET_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "WARN"})
# A line that states an error: "ValueError: ...", "torch._dynamo.exc.Unsupported: ...",
# 'ValueError("type fp8e4nv ...")', "api_server.py: error: ...", crashes without an
# exception ("Segmentation fault (core dumped)"), NCCL's own warnings, and the source line
# of a failed assertion on the KV dtype, which tracebacks print (the H200 e5m2 crash).
_ERROR_LINE = re.compile(
    r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Unsupported|error)\b\s*[:(]|^[^:]{1,80}: error: "
    r"|^(?:[\w.]+\.)?\w*(?:Error|Exception)$|^Value error, "
    r"|CUDA error: |NCCL error|NCCL WARN|Segmentation fault|core dumped"
    r"|^assert\b.*\bkv_cache_dtype\b"
)
# vLLM's re-raises that point elsewhere: "See root cause above", "for the root cause".
_POINTER_LINE = re.compile(r"root cause|See stack trace", re.IGNORECASE)
# The OpenAI server logs this once the engine is up and the port answers.
_SERVER_READY = re.compile(r"Application startup complete")
# What changes between two runs of the same failure: numbers, addresses, ids, paths' tails.
_VOLATILE = re.compile(r"0x[0-9a-f]+|\d+(?:\.\d+)?|[0-9a-f]{8,}", re.IGNORECASE)
SIGNATURE_LIMIT = 200
_CONTEXT_LINE_LIMIT = 1000
# Which process printed a line: vLLM's API server, engine core and workers interleave.
_PROCESS = re.compile(r"^(?:[\w.-]+\s+\|\s)?(\([\w .=-]+ pid=\d+\))?")
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\):")
_FRAME = re.compile(r'^File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
# Installed packages are named from their package directory on.
_INSTALLED = re.compile(r"^.*/(?:site|dist)-packages/")


@dataclass(frozen=True)
class Frame:
    """One frame of a traceback: `vllm/model_executor/models/llama.py`, 114, `__init__`."""

    path: str
    line: int
    function: str


def error_lines(text: str) -> list[str]:
    """Distinct lines that state an error, log prefixes and quiet levels removed, in order."""
    seen: set[str] = set()
    out: list[str] = []
    for raw in text.splitlines():
        match = _LOG_PREFIX.match(raw)
        level = match.group("level") if match else None
        line = raw[match.end() if match else 0 :].strip()
        # NCCL writes its failures as "host:pid:tid [0] NCCL WARN ...", whatever the level.
        if level in _QUIET_LEVELS and "NCCL WARN" not in line:
            continue
        if not line or line in seen or not _ERROR_LINE.search(line):
            continue
        seen.add(line)
        out.append(line)
    return out


def raising_frames(text: str) -> dict[str, tuple[Frame, ...]]:
    """The traceback frames of each error line (as `error_lines` writes it), innermost last.

    Two layouts: a log prints a traceback's frames before its exception line (after
    "Traceback (most recent call last):"); kvq's evidence wrapper writes a cause's frames
    after it, indented. Lines of different processes are kept apart, and tracebacks logged
    at a quiet level (a warning that recovered) are skipped.
    """
    pending: dict[str, list[Frame]] = {}
    last: dict[str, str | None] = {}
    found: dict[str, list[Frame]] = {}
    for raw in text.splitlines():
        process = _PROCESS.match(raw)
        tag = (process.group(1) if process else None) or ""
        match = _LOG_PREFIX.match(raw)
        level = match.group("level") if match else None
        if level in _QUIET_LEVELS:
            continue
        line = raw[match.end() if match else 0 :].strip()
        if _TRACEBACK.match(line):
            pending[tag], last[tag] = [], None
            continue
        frame = _FRAME.match(line)
        if frame is not None:
            parsed = Frame(_INSTALLED.sub("", frame["path"]), int(frame["line"]), frame["function"])
            owner = last.get(tag)
            if owner is not None:
                found[owner].append(parsed)  # the wrapper's layout: frames after the cause
            else:
                pending.setdefault(tag, []).append(parsed)
            continue
        if _ERROR_LINE.search(line):
            frames = pending.pop(tag, [])
            if len(frames) >= len(found.get(line, [])):
                found[line] = frames
            last[tag] = line
    return {line: tuple(frames) for line, frames in found.items()}


def context_lines(text: str) -> list[str]:
    """Every line that is not INFO or DEBUG chatter, log prefixes removed."""
    out: list[str] = []
    for raw in text.splitlines():
        match = _LOG_PREFIX.match(raw)
        if match and match.group("level") in ("DEBUG", "INFO"):
            continue
        line = raw[match.end() if match else 0 :].strip()
        # Long lines are dumps (the engine's whole config), not messages.
        if line and len(line) <= _CONTEXT_LINE_LIMIT:
            out.append(line)
    return out


def root_cause_index(lines: list[str]) -> int:
    """The first line that is not one of vLLM's wrappers pointing "above" to the cause."""
    for index, line in enumerate(lines):
        if not _POINTER_LINE.search(line):
            return index
    return 0


def served_before_failure(text: str) -> bool:
    """The log shows the server finished starting before the first error line."""
    ready_at = _SERVER_READY.search(text)
    if ready_at is None:
        return False
    before = text[: ready_at.start()]
    return not error_lines(before)


def signature_of(line: str) -> str:
    return _VOLATILE.sub("#", redact_text(line))[:SIGNATURE_LIMIT]


def excerpt_from(lines: list[str], start: int) -> str:
    return bound_excerpt(redact_text("\n".join(lines[start:])))


def sentence(text: str) -> str:
    return text if text.endswith((".", "!", "?")) else text + "."


def short(line: str, limit: int = 300) -> str:
    line = line.strip().rstrip(".")
    return line if len(line) <= limit else line[: limit - 3] + "..."
