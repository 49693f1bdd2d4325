"""The failure-evidence wrapper, run for real around a child that replays vLLM's output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvq.render import evidence_wrapper
from kvq.render.evidence_wrapper import MAX_SUMMARY_BYTES, Evidence, summarize

WRAPPER = Path(evidence_wrapper.__file__)
FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm"
KUBELET_TAIL_BYTES = 2048


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: bytes
    stderr: bytes
    message: str | None


def run_wrapper(tmp_path: Path, child: list[str], timeout: float = 60) -> Run:
    termination_log = tmp_path / "termination-log"
    result = subprocess.run(
        [sys.executable, str(WRAPPER), "--", *child],
        capture_output=True,
        timeout=timeout,
        env={**os.environ, "KVQ_TERMINATION_LOG": str(termination_log)},
        check=False,
    )
    message = termination_log.read_text() if termination_log.exists() else None
    return Run(result.returncode, result.stdout, result.stderr, message)


def replay(fixture: str, exit_code: int) -> list[str]:
    """A child that prints a captured vLLM log and exits like the engine did."""
    code = (
        "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read()); "
        "sys.stdout.flush(); sys.exit(int(sys.argv[2]))"
    )
    return [sys.executable, "-c", code, str(FIXTURES / fixture), str(exit_code)]


@pytest.mark.parametrize(
    ("fixture", "root_cause"),
    [
        (
            "cpu-v0.32.0-tiny-head80-fp8-crash.log",
            "NotImplementedError: FP8 KV cache requires head_size divisible by 32 on CPU.",
        ),
        (
            "h200-v0.26.0-llama3-8b-fp8_e5m2-crash.log",
            "torch._dynamo.exc.Unsupported: Data-dependent assertion failed "
            "(cannot compile partial graph)",
        ),
        (
            "cpu-v0.32.0-tiny-head16-auto-crash-after-ready.log",
            "RuntimeError: Unsupported CPU attention configuration: head_dim=16",
        ),
    ],
)
def test_crash_writes_the_buried_root_cause_first(
    tmp_path: Path, fixture: str, root_cause: str
) -> None:
    log = (FIXTURES / fixture).read_bytes()
    # The premise: the kubelet's own tail would have lost the cause.
    assert root_cause.encode() not in log[-KUBELET_TAIL_BYTES:]

    run = run_wrapper(tmp_path, replay(fixture, 1))

    assert run.returncode == 1
    assert run.stdout == log  # passed through unchanged
    assert run.message is not None
    assert len(run.message.encode()) <= MAX_SUMMARY_BYTES
    lines = run.message.splitlines()
    assert lines[0] == "engine exited with code 1"
    first_cause = lines[lines.index("error lines, most specific first:") + 1]
    assert first_cause.startswith(root_cause)


def test_e5m2_crash_keeps_the_assert_that_names_the_dtypes(tmp_path: Path) -> None:
    run = run_wrapper(tmp_path, replay("h200-v0.26.0-llama3-8b-fp8_e5m2-crash.log", 1))
    assert run.message is not None
    assert 'assert self.kv_cache_dtype in {"fp8", "fp8_e4m3", "nvfp4"}' in run.message
    # vLLM's "see root cause above" re-raise comes after the specific cause.
    assert run.message.index("Data-dependent") < run.message.index("initialization failed")


def test_crash_after_ready_says_the_engine_had_served(tmp_path: Path) -> None:
    run = run_wrapper(tmp_path, replay("cpu-v0.32.0-tiny-head16-auto-crash-after-ready.log", 1))
    assert run.message is not None
    assert "Application startup complete" in run.message.splitlines()[1]


def test_crash_after_serving_is_recorded_even_when_vllm_exits_0(tmp_path: Path) -> None:
    fixture = "cpu-v0.32.0-tiny-head16-auto-first-request-500-exit0.log"
    run = run_wrapper(tmp_path, replay(fixture, 0))
    assert run.returncode == 0
    assert run.message is not None
    assert "Unsupported CPU attention configuration: head_dim=16" in run.message


def test_start_up_crash_does_not_claim_the_engine_served(tmp_path: Path) -> None:
    run = run_wrapper(tmp_path, replay("cpu-v0.32.0-tiny-head80-fp8-crash.log", 1))
    assert run.message is not None
    assert "Application startup complete" not in run.message


@pytest.mark.parametrize(
    "fixture", ["cpu-v0.32.0-tiny-head80-auto-ok.log", "h200-v0.26.0-llama3-8b-fp8-ok.log"]
)
def test_clean_exit_writes_nothing(tmp_path: Path, fixture: str) -> None:
    run = run_wrapper(tmp_path, replay(fixture, 0))
    assert run.returncode == 0
    assert run.message is None
    assert run.stdout == (FIXTURES / fixture).read_bytes()


def test_stderr_stays_on_stderr_and_exit_code_is_kept(tmp_path: Path) -> None:
    child = [
        sys.executable,
        "-c",
        "import sys; print('out'); print('ValueError: bad value', file=sys.stderr); sys.exit(3)",
    ]
    run = run_wrapper(tmp_path, child)
    assert (run.returncode, run.stdout, run.stderr) == (3, b"out\n", b"ValueError: bad value\n")
    assert run.message is not None
    assert "ValueError: bad value" in run.message


def test_no_error_line_falls_back_to_the_last_lines(tmp_path: Path) -> None:
    child = [sys.executable, "-c", "import sys; print('loading'); print('bye'); sys.exit(7)"]
    run = run_wrapper(tmp_path, child)
    assert run.returncode == 7
    assert (
        run.message == "engine exited with code 7\nno error line found; last lines:\nloading\nbye"
    )


def test_sigterm_is_forwarded_to_the_engine(tmp_path: Path) -> None:
    marker = tmp_path / "got-sigterm"
    child_code = (
        "import signal, sys\n"
        "def stop(*_):\n"
        f"    open({str(marker)!r}, 'w').close(); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "signal.pause()  # runs until a signal arrives, like an engine\n"
    )
    with subprocess.Popen(
        [sys.executable, str(WRAPPER), "--", sys.executable, "-c", child_code],
        stdout=subprocess.PIPE,
        env={**os.environ, "KVQ_TERMINATION_LOG": str(tmp_path / "termination-log")},
    ) as wrapper:
        assert wrapper.stdout is not None
        assert wrapper.stdout.readline() == b"ready\n"  # the child is up and has its handler
        wrapper.send_signal(signal.SIGTERM)
        assert wrapper.wait(timeout=30) == 0
    assert marker.exists()
    assert not (tmp_path / "termination-log").exists()


def test_engine_killed_by_signal_exits_like_a_shell_would(tmp_path: Path) -> None:
    child = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    run = run_wrapper(tmp_path, child)
    assert run.returncode == 128 + signal.SIGKILL
    assert run.message is not None
    assert run.message.startswith(f"engine exited with code {128 + signal.SIGKILL} (killed by")


def test_summary_stays_within_the_kubelet_limit() -> None:
    evidence = Evidence()
    for i in range(200):
        evidence.add_line(f"ValueError: distinct failure number {i} " + "x" * 300)
    message = summarize(1, evidence)
    assert len(message.encode()) <= MAX_SUMMARY_BYTES
    assert "failure number 0 " in message  # the first cause survives the cut


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        ("(Worker pid=1) ERROR 11-30 09:49:16 [x.py:1] ValueError: boom", "ValueError: boom"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", None),
        ("AssertionError", "AssertionError"),
        ("WARNING 11-30 09:48:41 [s.py:2] errors like `OSError: [Errno 24]`", ""),
        ('INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error', ""),
        ("UserWarning: resource_tracker: leaked shared_memory objects", ""),
    ],
)
def test_which_lines_count_as_causes(line: str, kept: str | None) -> None:
    evidence = Evidence()
    evidence.add_line(line)
    causes = [c.line for c in evidence.ranked()]
    if kept == "":
        assert causes == []
    else:
        assert causes == [kept if kept is not None else line]
