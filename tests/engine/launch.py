"""Starting real vLLM for the engine tier: the engine venv, tiny models, one server."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ENGINE_DIR = Path(__file__).resolve().parents[2] / "e2e" / "engine"
sys.path.insert(0, str(ENGINE_DIR))

import server  # noqa: E402
import tiny_model  # noqa: E402

# GiB of KV cache the CPU backend allocates (VLLM_CPU_KVCACHE_SPACE).
KV_CACHE_SPACE_GIB = 1
# Start-up took 45 s on an idle 2-core machine, up to 5 min while Go builds ran beside it.
START_DEADLINE_S = float(os.environ.get("KVQ_ENGINE_START_DEADLINE_S", "900"))
# Every case serves the same way; only the model shape and the KV dtype vary.
BASE_ENGINE_ARGS = ("--dtype", "bfloat16", "--max-model-len", "512", "--load-format", "dummy")

__all__ = ["KV_CACHE_SPACE_GIB", "ServedEngine", "find_engine_venv", "server", "start_engine"]


@dataclass(frozen=True)
class ServedEngine:
    """A healthy server and what it was started with."""

    engine: server.RunningServer
    model: Path
    shape: tiny_model.TinyShape
    kv_cache_dtype: str


def find_engine_venv() -> Path | None:
    """KVQ_ENGINE_VENV if set, else the venv install.sh built; None if not installed."""
    named = os.environ.get("KVQ_ENGINE_VENV")
    if named:
        return Path(named)
    check = subprocess.run(
        [str(ENGINE_DIR / "install.sh"), "--check"], capture_output=True, text=True, check=False
    )
    return Path(check.stdout.strip()) if check.returncode == 0 else None


def write_model(engine_python: Path, preset: str, directory: Path) -> Path:
    """Runs the generator in the engine venv: training the tokenizer needs `tokenizers`."""
    subprocess.run(
        [str(engine_python), str(ENGINE_DIR / "tiny_model.py"), preset, str(directory)],
        check=True,
        capture_output=True,
    )
    return directory


def start_engine(
    engine_python: Path, workdir: Path, preset: str, kv_cache_dtype: str
) -> ServedEngine | server.StartupFailure:
    """Writes the preset's model into `workdir` and starts vLLM on it (log in `workdir`)."""
    model = write_model(engine_python, preset, workdir / f"tiny-{preset}")
    port = server.free_port()
    argv = server.api_server_argv(
        engine_python, model, port, [*BASE_ENGINE_ARGS, "--kv-cache-dtype", kv_cache_dtype]
    )
    started = server.start_server(
        argv,
        port,
        workdir / f"vllm-{preset}-{kv_cache_dtype}.log",
        env={"VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_SPACE_GIB)},
        startup_deadline_s=START_DEADLINE_S,
    )
    if isinstance(started, server.StartupFailure):
        return started
    return ServedEngine(started, model, tiny_model.PRESETS[preset], kv_cache_dtype)
